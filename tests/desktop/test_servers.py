"""Model servers the user added (desktop.servers): the saved list, the address as typed, and API keys kept in the
system's keyring, or in a file only the user can read where the system has none."""

import stat

import keyring
import pytest
from keyring.backends.fail import Keyring as NoKeyring

from desktop.servers import KEYRING_SERVICE, KeyStore, Server, normalised_url, servers_from_json, servers_to_json


@pytest.fixture
def no_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(NoKeyring())
    yield
    keyring.set_keyring(before)


def test_the_saved_list_round_trips_and_skips_what_it_cannot_read():
    servers = [Server("Lab", "http://gpu-box:8089/v1", False, ["r1-14b"]), Server("Own", "https://x/v1", True, [])]
    assert servers_from_json(servers_to_json(servers)) == servers
    assert servers_from_json("not json") == []
    assert servers_from_json('[{"name": "no url"}, 3, {"url": "http://a/v1", "models": ["m", 7]}]') == [
        Server("http://a/v1", "http://a/v1", False, ["m"])
    ]


def test_an_address_as_typed_becomes_the_openai_root():
    assert normalised_url("gpu-box:8089") == "http://gpu-box:8089/v1"
    assert normalised_url(" https://api.example.com/ ") == "https://api.example.com/v1"
    assert normalised_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert normalised_url("http://host/openai/v1") == "http://host/openai/v1"  # a path given is kept


def test_keys_live_in_the_system_keyring_not_in_a_file(system_keyring, tmp_path):
    store = KeyStore(tmp_path / "keys")
    store.set("http://gpu-box:8089/v1", "sk-secret")
    assert system_keyring.items == {(KEYRING_SERVICE, "http://gpu-box:8089/v1"): "sk-secret"}
    assert not (tmp_path / "keys").exists()
    assert store.get("http://gpu-box:8089/v1") == "sk-secret"
    assert store.get("http://other/v1") is None
    assert "keyring" in store.where()
    store.delete("http://gpu-box:8089/v1")
    store.delete("http://gpu-box:8089/v1")  # twice: nothing to delete is not an error
    assert store.get("http://gpu-box:8089/v1") is None


def test_without_a_keyring_a_key_goes_to_a_file_only_the_user_can_read(no_keyring, tmp_path):
    store = KeyStore(tmp_path / "keys")
    assert "no keyring" in store.where()
    store.set("http://gpu-box:8089/v1", "sk-secret")
    (path,) = (tmp_path / "keys").iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "gpu-box" not in path.name  # the file name doesn't tell which server
    assert store.get("http://gpu-box:8089/v1") == "sk-secret"
    store.set("http://gpu-box:8089/v1", "")  # an emptied key field removes it
    assert store.get("http://gpu-box:8089/v1") is None and not path.exists()
