"""Issue 17, item 2: a token cache damaged without changing its size is caught by its content
hash: a run refuses to map it, and the next compare rebuilds it and trains to the same numbers."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from faultlib import TINY, invoke, write_config

from in_process import use_in_process_workers
from normlab.data.cache import load_tokens, prepare_tokens
from normlab.data.verify import HASHES_KEY, cache_problem


def _scramble(path: Path) -> None:
    """Overwrite ``path`` with random bytes of the same size."""
    size = path.stat().st_size
    path.write_bytes(os.urandom(size))
    assert path.stat().st_size == size


def test_a_same_size_damaged_cache_is_refused_by_a_run_and_rebuilt_by_prepare(
    tmp_path: Path, corpus: Path
) -> None:
    data = tmp_path / "data"
    info = prepare_tokens(data, corpus, max_bytes=8192)
    assert info[HASHES_KEY], info
    original = (data / "tokens.u8").read_bytes()
    assert cache_problem(data, info, "tokens.u8") is None

    _scramble(data / "tokens.u8")
    assert "hashes as" in (cache_problem(data, info, "tokens.u8") or "")
    with pytest.raises(ValueError, match=r"token cache .* is damaged"):
        load_tokens(data)

    again = prepare_tokens(data, corpus, max_bytes=8192)  # rebuilt from the source
    assert again["fingerprint"] == info["fingerprint"]
    assert (data / "tokens.u8").read_bytes() == original
    assert load_tokens(data).train.tobytes() == original[: info["n_train_tokens"]]


def test_a_compare_over_a_damaged_cache_rebuilds_it_and_gets_identical_numbers(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_in_process_workers(monkeypatch)  # the cache is the subject, not the processes
    config = write_config(tmp_path / "tiny.yaml", TINY)
    out = tmp_path / "out"
    args = ("compare", "--config", str(config), "--data", str(corpus), "--out", str(out))
    code, output = invoke(*args, "--no-report")
    assert code == 0, output
    run = sorted((out / "runs").iterdir())[0]
    before = json.loads((run / "summary.json").read_text(encoding="utf-8"))

    _scramble(out / "data" / "tokens.u8")
    shutil.rmtree(run)  # this run is redone, on the cache as it is now
    code, output = invoke(*args, "--no-report")
    assert code == 0, output
    after = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert after["status"] == "finished"
    for key in ("final_val_loss", "final_val_bpb", "data_fingerprint"):
        assert after[key] == before[key], key
