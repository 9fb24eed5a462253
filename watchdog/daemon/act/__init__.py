"""Acting on a hung job: the response on a worker (hold or fence, then the enforcer's
ladder), the one seam that signals, evidence, the incident, the peers."""
