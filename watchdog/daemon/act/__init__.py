"""Acting on a hung job: the response on a worker (hold or fence, then the enforcer's
ladder), evidence, the incident, the peers. Every signal goes through ../signaller.py."""
