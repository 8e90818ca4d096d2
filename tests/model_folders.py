"""Breaking a model folder and checking what the load says (the model_copy fixture gives the folder): the one-line
message naming the file and the problem (test_locate_errors, test_config, test_weights)."""

import json

import pytest

from model_loader.engine import Engine
from model_loader.errors import ModelError


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def expect_error(folder, *fragments, device="cpu"):
    with pytest.raises(ModelError) as info:
        Engine.load(folder, device=device)
    msg = str(info.value)
    assert "\n" not in msg
    for fragment in fragments:
        assert fragment in msg, msg
    return msg
