"""Light and dark themes: one palette dict feeds the Qt palette, the widget stylesheet and the HTML renderer.

"system" follows the OS colour scheme (Qt 6.5+ QStyleHints.colorScheme) and updates live when it changes.
Fusion is used everywhere so both themes look the same on Windows, macOS and Linux.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Theme:
    name: str
    window: str
    surface: str  # sidebar, panels
    base: str  # chat background, inputs
    text: str
    muted: str
    faint: str  # reasoning text: quieter than muted body text
    border: str
    accent: str
    accent_text: str
    user_bubble: str
    code_bg: str
    code_header: str
    reasoning_bg: str
    danger: str
    warning_bg: str
    selection: str
    pygments: str
    plot_a: str
    plot_b: str

    @property
    def dark(self) -> bool:
        return self.name == "dark"


LIGHT = Theme(
    name="light",
    window="#f6f7f9",
    surface="#eef0f3",
    base="#ffffff",
    text="#1f2328",
    muted="#59636e",
    faint="#6e7781",
    border="#d8dde3",
    accent="#2f6fde",
    accent_text="#ffffff",
    user_bubble="#eaf1fd",
    code_bg="#f6f8fa",
    code_header="#eaeef2",
    reasoning_bg="#f7f7f9",
    danger="#c62828",
    warning_bg="#fff4e5",
    selection="#cfe0fb",
    pygments="default",
    plot_a="#2f6fde",
    plot_b="#d9822b",
)
DARK = Theme(
    name="dark",
    window="#17191c",
    surface="#1d2024",
    base="#202327",
    text="#e6e8eb",
    muted="#9aa3ad",
    faint="#8b939c",
    border="#33383e",
    accent="#5b9bff",
    accent_text="#0d1117",
    user_bubble="#26303d",
    code_bg="#16181b",
    code_header="#262a30",
    reasoning_bg="#1b1e22",
    danger="#ff6b6b",
    warning_bg="#3a2f1c",
    selection="#2c4a77",
    pygments="github-dark",
    plot_a="#5b9bff",
    plot_b="#f0a050",
)


def system_is_dark() -> bool:
    hints = QGuiApplication.styleHints()
    return getattr(hints, "colorScheme", None) is not None and hints.colorScheme() == Qt.ColorScheme.Dark


def resolve(choice: str) -> Theme:
    if choice == "dark":
        return DARK
    if choice == "light":
        return LIGHT
    return DARK if system_is_dark() else LIGHT


def apply(app: QApplication, theme: Theme, font_pt: int) -> None:
    app.setStyle("Fusion")
    pal = QPalette()
    c = QColor
    pal.setColor(QPalette.Window, c(theme.window))
    pal.setColor(QPalette.WindowText, c(theme.text))
    pal.setColor(QPalette.Base, c(theme.base))
    pal.setColor(QPalette.AlternateBase, c(theme.surface))
    pal.setColor(QPalette.Text, c(theme.text))
    pal.setColor(QPalette.PlaceholderText, c(theme.faint))
    pal.setColor(QPalette.Button, c(theme.surface))
    pal.setColor(QPalette.ButtonText, c(theme.text))
    pal.setColor(QPalette.Highlight, c(theme.selection))
    pal.setColor(QPalette.HighlightedText, c(theme.text))
    pal.setColor(QPalette.ToolTipBase, c(theme.base))
    pal.setColor(QPalette.ToolTipText, c(theme.text))
    pal.setColor(QPalette.Link, c(theme.accent))
    pal.setColor(QPalette.Mid, c(theme.border))
    for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
        pal.setColor(QPalette.Disabled, role, c(theme.faint))
    app.setPalette(pal)
    font = QFont(app.font())
    font.setPointSize(font_pt)
    app.setFont(font)
    app.setStyleSheet(stylesheet(theme, font_pt))


def stylesheet(t: Theme, font_pt: int) -> str:
    return f"""
    QMainWindow, QDialog {{ background: {t.window}; }}
    #Sidebar {{ background: {t.surface}; border-right: 1px solid {t.border}; }}
    #LivePanel {{ background: {t.surface}; border-left: 1px solid {t.border}; }}
    #LivePanel QLabel[role="section"] {{ color: {t.muted}; font-weight: 600; margin-top: 8px; }}
    #LivePanel QLabel[role="value"] {{ color: {t.text}; }}
    #LivePanel QLabel[role="key"] {{ color: {t.muted}; }}
    #LivePanel QLabel[role="notice"] {{
        color: {t.text}; background: {t.warning_bg}; border-radius: 6px; padding: 6px; }}
    #TopBar {{ background: {t.window}; border-bottom: 1px solid {t.border}; }}
    #TopBar QLabel#ChatTitle {{ font-weight: 600; }}
    #ChatArea, #ChatArea > QWidget > QWidget, #ChatPage, #Welcome {{ background: {t.base}; }}
    #Composer {{ background: {t.base}; border: 1px solid {t.border}; border-radius: 12px; }}
    #Composer QPlainTextEdit {{ background: transparent; border: none; }}
    QLineEdit, QPlainTextEdit, QSpinBox, QDoubleSpinBox, QComboBox {{
        background: {t.base}; border: 1px solid {t.border}; border-radius: 6px; padding: 4px 6px;
        selection-background-color: {t.selection}; }}
    QLineEdit:focus, QPlainTextEdit:focus, QSpinBox:focus, QDoubleSpinBox:focus, QComboBox:focus {{
        border-color: {t.accent}; }}
    QPushButton {{ background: {t.base}; border: 1px solid {t.border}; border-radius: 6px; padding: 5px 12px; }}
    QPushButton:hover {{ border-color: {t.accent}; }}
    QPushButton:disabled {{ color: {t.faint}; }}
    QPushButton[primary="true"] {{ background: {t.accent}; color: {t.accent_text}; border-color: {t.accent};
        font-weight: 600; }}
    QPushButton[primary="true"]:disabled {{ background: {t.border}; border-color: {t.border}; color: {t.faint}; }}
    QPushButton[danger="true"] {{ color: {t.danger}; }}
    QToolButton {{ border: none; border-radius: 5px; padding: 3px 7px; color: {t.muted}; background: transparent; }}
    QToolButton[msgaction="true"] {{ font-size: {max(font_pt - 2, 8)}pt; color: {t.faint}; padding: 2px 6px; }}
    QToolButton::menu-indicator {{ image: none; width: 0; }}
    QToolButton:hover {{ background: {t.border}; color: {t.text}; }}
    QToolButton:checked {{ color: {t.accent}; }}
    QListWidget {{ background: transparent; border: none; outline: none; }}
    QListWidget::item {{ padding: 7px 8px; border-radius: 6px; margin: 1px 0; }}
    QListWidget::item:selected {{ background: {t.selection}; color: {t.text}; }}
    QListWidget::item:hover:!selected {{ background: {t.border}; }}
    #UserBubble {{ background: {t.user_bubble}; border-radius: 12px; }}
    #ReasoningBody {{ background: {t.reasoning_bg}; border-left: 3px solid {t.border}; border-radius: 4px; }}
    QToolButton#ReasoningToggle {{ color: {t.faint}; font-size: {max(font_pt - 1, 8)}pt; padding: 2px 4px; }}
    QLabel#Meta {{ color: {t.faint}; font-size: {max(font_pt - 2, 8)}pt; }}
    QLabel#Role {{ font-weight: 600; }}
    #Banner {{ background: {t.warning_bg}; border: 1px solid {t.border}; border-radius: 8px; }}
    QProgressBar {{ border: 1px solid {t.border}; border-radius: 4px; background: {t.base}; text-align: center;
        height: 14px; }}
    QProgressBar::chunk {{ background: {t.accent}; border-radius: 3px; }}
    QScrollBar:vertical {{ background: transparent; width: 10px; margin: 0; }}
    QScrollBar::handle:vertical {{ background: {t.border}; border-radius: 4px; min-height: 30px; }}
    QScrollBar::add-line, QScrollBar::sub-line {{ height: 0; }}
    QStatusBar {{ color: {t.muted}; }}
    QSplitter::handle {{ background: {t.border}; }}
    """


def make_heading(label, scale: float) -> None:
    """Bold, and `scale` times the base font size: the app's title labels."""
    f = label.font()
    f.setPointSizeF(f.pointSizeF() * scale)
    f.setBold(True)
    label.setFont(f)
