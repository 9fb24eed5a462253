"""Looking at ranks: `status`, `watch`, `inspect` and `cluster status`, and the sampling
they share when no daemon answers."""
