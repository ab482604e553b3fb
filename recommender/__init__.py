"""What to run: features from registry facts, the speed model, ranking under a policy.

The functions other parts call:

- `recommend.recommend(con, target, model=, host=, task=, policy=) -> Recommendation`
- `train.fit(local) -> SpeculationRegressor`, `train.train(local)` (fit, cross-validate, save),
  `train.load_trained()`
- `host.detect_host_facts(bandwidth=None, fingerprint=) -> HostFacts`
- `local.local_observations(con, host) -> list[Observation]` (this host's recorded runs)
- `prior.load_prior()` (the shipped reference-host runs, data/PROVENANCE.md)
"""
