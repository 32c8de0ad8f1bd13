"""One run's training: the loop (:mod:`~normlab.experiment.training.train`), its precision
(:mod:`~normlab.experiment.training.precision`), its processes
(:mod:`~normlab.experiment.training.parallel`), the learning-rate schedule and optimiser
(:mod:`~normlab.experiment.training.schedule`) and the step timer
(:mod:`~normlab.experiment.training.step_timer`)."""
