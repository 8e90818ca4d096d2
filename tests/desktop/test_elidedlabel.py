"""The label that gives way (desktop.elidedlabel): it asks for no more than its widest and can shrink to a few
characters, while its full text stays in text() and in the tooltip."""

from __future__ import annotations

from desktop.elidedlabel import MIN_CHARS, ElidedLabel

LONG = "A conversation about lighthouses, ships and the keepers of the northern coast, at length"


def test_it_asks_for_its_widest_at_most_and_shrinks_to_a_few_characters(qtbot):
    short = ElidedLabel("Hi", widest=300)
    long = ElidedLabel(LONG, widest=300)
    qtbot.addWidget(short)
    qtbot.addWidget(long)
    assert long.fontMetrics().horizontalAdvance(LONG) > 300
    assert long.sizeHint().width() == 300
    assert short.sizeHint().width() < 300  # a short text asks for what it needs
    assert long.minimumSizeHint().width() <= long.fontMetrics().averageCharWidth() * MIN_CHARS
    assert short.minimumSizeHint().width() <= short.sizeHint().width()


def test_the_full_text_stays_readable(qtbot):
    label = ElidedLabel(LONG, widest=200)
    qtbot.addWidget(label)
    assert label.toolTip() == LONG
    label.setText("Another title")
    assert label.text() == label.toolTip() == "Another title"
    label.resize(60, label.sizeHint().height())
    label.show()
    qtbot.waitExposed(label)
    label.repaint()  # painted elided without error; its text is whole
    assert label.text() == "Another title"
