"""What a run measures besides its training loss: loss and gradient spikes
(:mod:`~normlab.experiment.measure.anomaly`), norm health
(:mod:`~normlab.experiment.measure.health`), saved activations and hooked passes
(:mod:`~normlab.experiment.measure.activations`), validation and samples
(:mod:`~normlab.experiment.measure.evaluate`) and post-training effects
(:mod:`~normlab.experiment.measure.posttrain`). Nothing here trains or reads the config."""
