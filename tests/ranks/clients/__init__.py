"""Real clients nobody here wrote: mlx-lm, mlx_lm.server, mpirun."""
