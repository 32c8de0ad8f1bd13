"""The controlled comparison: config → grid of paired runs → a worker per run → metrics on disk.

One sub-package per job, top to bottom (each imports only those below it; docs/DESIGN.md §2):

- :mod:`~normlab.experiment.execution`: the grid of runs: plan it, lock and check the output
  folder, train every run in its own process (an executor), add seeds until decided;
- :mod:`~normlab.experiment.training`: one run's training loop, its precision, its processes,
  its learning-rate schedule and step timing;
- :mod:`~normlab.experiment.testbeds`: what differs between a GPT, a DiT and a user's model;
- :mod:`~normlab.experiment.config`: the validated configuration;
- :mod:`~normlab.experiment.measure`: what a run measures besides its loss: anomalies, norm
  health, saved activations, validation, post-training effects.

See docs/DESIGN.md §3 and docs/run-format.md for the data flow and the output folder.
"""
