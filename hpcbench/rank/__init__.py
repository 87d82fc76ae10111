"""What every rank relies on, whatever its framework: who it is (env.py), bookkeeping
collectives (collectives.py), ports, rendezvous and parent watching (net.py), the stall
watchdog (watchdog.py), failure accounts (failures.py) and provenance (provenance.py).

The worker (`hpcbench.worker`) ties them together."""
