"""From a spec to launches: points checked against the registries and turned into argv and
environment (launch.py), site profiles (profiles.py, shipped in profiles/), named
environments (envs.py) and the probe of what works in each (capabilities.py)."""
