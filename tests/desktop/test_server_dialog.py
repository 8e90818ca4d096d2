"""Adding a model server (desktop.server_dialog): against a real `r1desk-cli serve` on the tiny model (the lab
fixture), the address as typed made the API's root, a wrong key said so, the models listed once the key is right,
and a name already taken refused."""

from serving import API_KEY

from desktop.servers import Server


def test_add_server_lists_the_models_once_the_key_is_right(qtbot, lab):
    from PySide6.QtWidgets import QDialogButtonBox

    from desktop.server_dialog import AddServerDialog

    model_id, url = lab
    dlg = AddServerDialog(None, {"Lab"}, keys_where="the system keyring")
    qtbot.addWidget(dlg)
    add = dlg.buttons.button(QDialogButtonBox.Ok)
    dlg.url.setText(url.removeprefix("http://").removesuffix("/v1"))  # typed without scheme and path
    dlg.key.setText("wrong")
    dlg.check()
    qtbot.waitUntil(lambda: "Could not use this server" in dlg.status.text(), timeout=20000)
    assert "refused the API key" in dlg.status.text() and not add.isEnabled()
    assert dlg.url.text() == url  # made the OpenAI root
    dlg.key.setText(API_KEY)
    dlg.check()
    qtbot.waitUntil(lambda: bool(dlg.models), timeout=20000)
    assert dlg.models == [model_id] and add.isEnabled()
    dlg.name.setText("Lab")
    dlg.accept()  # a name already taken is refused, the dialog stays open
    assert "already added" in dlg.status.text() and not dlg.result()
    dlg.name.setText("Lab 2")
    dlg.accept()
    assert dlg.server() == Server("Lab 2", url, False, [model_id]) and dlg.api_key() == API_KEY
