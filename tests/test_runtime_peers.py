"""Peers in venvs of their own (``make peers``): ExecuTorch 1.5.1 behind the runtimes' wire.

The missing-install message is checked without any install; the real peer (slow: lowering a
model takes half a minute) only where ``make peers`` has installed it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torchvision

from fxmobile.runtime import LoadedFile, RuntimeProcess
from fxmobile.runtime.errors import RuntimeNotInstalledError
from fxmobile.runtime.install import PEERS, read_stamp
from fxmobile.runtime.process import require_peer
from fxmobile.verify import compare_outputs, randomize_batchnorm_statistics

ROOT = Path(__file__).resolve().parents[1]
EXECUTORCH = "executorch-1.5.1"


def test_a_missing_peer_names_make_peers(tmp_path: Path) -> None:
    with pytest.raises(RuntimeNotInstalledError, match="make peers"):
        require_peer(EXECUTORCH, tmp_path)


def test_peers_pin_their_own_torch() -> None:
    (spec,) = PEERS.values()
    assert spec.folder_name == EXECUTORCH
    assert any(r.startswith("torch==") for r in spec.requirements)
    assert any(r.startswith("executorch==1.5.1") for r in spec.requirements)


@pytest.mark.slow
@pytest.mark.skipif(
    read_stamp(PEERS[EXECUTORCH]) is None, reason=f"{EXECUTORCH} not installed: make peers"
)
def test_executorch_lowers_a_torchvision_model_that_matches_eager(tmp_path: Path) -> None:
    model = randomize_batchnorm_statistics(
        torchvision.models.get_model("mobilenet_v3_small", weights=None), (1, 3, 64, 64)
    )
    x = torch.randn(1, 3, 64, 64)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    script = ROOT / "benchmarks" / "executorch_peer.py"
    with RuntimeProcess(EXECUTORCH, 2, python=require_peer(EXECUTORCH), script=script) as peer:
        assert peer.info.torch == "2.14.1"
        reply = peer.call(
            "lower_torchvision",
            name="mobilenet_v3_small",
            weights=str(tmp_path / "weights.pt"),
            shape=[1, 3, 64, 64],
            output=str(tmp_path / "model.pte"),
        )
        assert reply["delegate_calls"] >= 1  # the XNNPACK delegate took the graph
        loaded = LoadedFile(peer, reply["handle"], "model.pte", "executorch")
        with torch.no_grad():
            (check,) = compare_outputs(model(x), loaded.run(x), 1e-4)
        assert check.passed, check.relative_error
        assert len(loaded.time(3, x)) == 3
    assert sys.modules.get("executorch") is None  # it never ran in this process
