"""Read TensorBoard event files with TensorBoard's own reader (``event_multiplexer``).

PATH is a log folder: every folder under it that holds event files (``events.out.tfevents.*``)
is one run, named as TensorBoard names it, by its path relative to PATH (``.`` for event files
directly in PATH); several event files in one folder (a resumed writer) make one run. Every
scalar is read, nothing sampled away: the ``scalars`` of ``SummaryWriter.add_scalar`` (PyTorch,
TensorBoardX) and the scalar tensors of ``tf.summary.scalar`` (TensorFlow 2). TensorBoard keeps
no run status, so every run counts as ended.

TensorBoard's reader stops quietly at a record that is cut short or fails its checksum (a writer
killed mid-record leaves one): it logs it at debug level and serves what came before. So each
event file of a run is also read record by record with TensorBoard's own record reader, whose
checksums and lengths are checked: a file that ends mid-record, holds a damaged record or cannot
be read is the run's :class:`~normlab.trackers.tracked.Damage`, with the last step read before it.
"""

from __future__ import annotations

from pathlib import Path

from normlab.trackers.tracked import Damage, TrackedRun, require, series_from_points

__all__ = ["read_tensorboard"]

_SCALARS_PLUGIN = "scalars"
"""The TensorBoard plugin whose tensors are scalars (TensorFlow 2's ``tf.summary.scalar``)."""
_FRAME_BYTES = 16
"""The bytes of a TFRecord frame around its data: length (8), its checksum (4), data checksum
(4)."""


def _file_damage(file: Path) -> Damage | None:
    """The damage of one event file, read record by record by TensorBoard's record reader
    (``PyRecordReader_New``: every length and checksum checked), or None when it ends after a
    whole record. The last step read is that of the last event with a summary before it."""
    records = require("tensorboard.compat.tensorflow_stub.pywrap_tensorflow", "tensorboard")
    errors = require("tensorboard.compat.tensorflow_stub.errors", "tensorboard")
    event_pb2 = require("tensorboard.compat.proto.event_pb2", "tensorboard")
    decode_error = require("google.protobuf.message", "tensorboard").DecodeError
    last, read = None, 0
    try:
        size = file.stat().st_size
        reader = records.PyRecordReader_New(str(file), 0, None, None)
        while True:
            reader.GetNext()
            event = event_pb2.Event.FromString(reader.record())
            read += len(reader.record()) + _FRAME_BYTES
            if event.HasField("summary"):
                last = event.step if last is None else max(last, event.step)
    except errors.OutOfRangeError:  # the end of the file, after a whole record
        return None
    except errors.DataLossError as err:
        cut = "truncated" in str(err)
        what = "ends mid-record" if cut else "holds a record that fails its checksum"
        why = "cut while it was written" if cut else "damaged"
        return Damage(str(file), f"{what} after byte {read:,} of {size:,} ({why})", last)
    except decode_error:
        return Damage(str(file), f"holds a record after byte {read:,} that is not an event", last)
    except (OSError, errors.OpError) as err:
        return Damage(str(file), f"cannot be read ({getattr(err, 'strerror', None) or err})", last)


def _run_damage(folder: Path) -> Damage | None:
    """The first damaged event file of the run in ``folder`` (the files TensorBoard reads
    there, in name order), or None."""
    io_wrapper = require("tensorboard.backend.event_processing.io_wrapper", "tensorboard")
    files = sorted(p for p in folder.iterdir() if io_wrapper.IsSummaryEventsFile(str(p)))
    for file in files:
        damage = _file_damage(file)
        if damage is not None:
            return damage
    return None


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
    folders = mux.RunPaths()
    runs = []
    for name, tags in sorted(mux.Runs().items()):
        run = TrackedRun(name=name, damage=_run_damage(Path(folders[name])))
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
