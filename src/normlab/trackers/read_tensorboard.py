"""Read TensorBoard event files with TensorBoard's own reader (``event_multiplexer``).

PATH is a log folder: every folder under it that holds event files (``events.out.tfevents.*``)
is one run, named as TensorBoard names it, by its path relative to PATH (``.`` for event files
directly in PATH); several event files in one folder (a resumed writer) make one run. Every
scalar is read, nothing sampled away: the ``scalars`` of ``SummaryWriter.add_scalar`` (PyTorch,
TensorBoardX) and the scalar tensors of ``tf.summary.scalar`` (TensorFlow 2). TensorBoard keeps
no run status, so every run counts as ended.
"""

from __future__ import annotations

from pathlib import Path

from normlab.trackers.tracked import TrackedRun, require, series_from_points

__all__ = ["read_tensorboard"]

_SCALARS_PLUGIN = "scalars"
"""The TensorBoard plugin whose tensors are scalars (TensorFlow 2's ``tf.summary.scalar``)."""


def read_tensorboard(path: Path) -> list[TrackedRun]:
    """The runs of the TensorBoard log folder ``path``, sorted by name."""
    accumulator = require("tensorboard.backend.event_processing.event_accumulator", "tensorboard")
    multiplexer = require("tensorboard.backend.event_processing.event_multiplexer", "tensorboard")
    tensor_util = require("tensorboard.util.tensor_util", "tensorboard")
    keep_all, keep_one = 0, 1  # size guidance: 0 keeps every event, 1 only the last
    guidance = {
        accumulator.SCALARS: keep_all,
        accumulator.TENSORS: keep_all,
        accumulator.IMAGES: keep_one,
        accumulator.AUDIO: keep_one,
        accumulator.HISTOGRAMS: keep_one,
        accumulator.COMPRESSED_HISTOGRAMS: keep_one,
    }
    mux = multiplexer.EventMultiplexer(size_guidance=guidance)
    mux.AddRunsFromDirectory(str(path))
    mux.Reload()
    runs = []
    for name, tags in sorted(mux.Runs().items()):
        run = TrackedRun(name=name)
        for tag in tags.get("scalars", []):
            run.series[tag] = series_from_points((e.step, e.value) for e in mux.Scalars(name, tag))
        for tag in tags.get("tensors", []):
            if tag in run.series:
                continue
            plugin = mux.SummaryMetadata(name, tag).plugin_data.plugin_name
            if plugin != _SCALARS_PLUGIN:
                continue
            points = []
            for event in mux.Tensors(name, tag):
                value = tensor_util.make_ndarray(event.tensor_proto)
                if value.size == 1:
                    points.append((event.step, float(value.reshape(()))))
            if points:
                run.series[tag] = series_from_points(points)
        runs.append(run)
    return runs
