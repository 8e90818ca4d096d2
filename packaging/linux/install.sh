#!/bin/sh
# Put r1desk into your application menu (for you only; no root), or take it out again:
#   ./install.sh               install the menu entry and icons for this folder's r1desk
#   ./install.sh --uninstall   remove them (the folder itself is left alone: delete it to remove the app)
# It writes only under $XDG_DATA_HOME (~/.local/share): applications/r1desk.desktop and
# icons/hicolor/*/apps/r1desk.{png,svg}. Run it again after moving the folder.
set -eu

BUNDLE=$(cd "$(dirname "$0")" && pwd)
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
APPS="$DATA/applications"
ICONS="$DATA/icons/hicolor"
ENTRY="$APPS/r1desk.desktop"
SIZES="16 24 32 48 64 128 256 512"

refresh() {  # menus and icon themes pick changes up sooner with fresh caches; neither tool is required
    if command -v update-desktop-database >/dev/null 2>&1; then update-desktop-database -q "$APPS" 2>/dev/null || true; fi
    if command -v gtk-update-icon-cache >/dev/null 2>&1; then gtk-update-icon-cache -q -t -f "$ICONS" 2>/dev/null || true; fi
}

# Exec= value: the path in double quotes with \ " ` $ escaped (Desktop Entry spec), then every backslash
# doubled again and % written %% (the spec's string-value escaping and field codes).
exec_value() {
    printf '%s' "$1" | sed -e 's/[\\"`$]/\\&/g' -e 's/\\/\\\\/g' -e 's/%/%%/g' -e 's/^/"/' -e 's/$/"/'
}

if [ "${1:-}" = "--uninstall" ]; then
    rm -f "$ENTRY" "$ICONS/scalable/apps/r1desk.svg"
    for size in $SIZES; do rm -f "$ICONS/${size}x${size}/apps/r1desk.png"; done
    refresh
    echo "r1desk: menu entry and icons removed. Delete $BUNDLE to remove the app itself."
    exit 0
fi
if [ $# -ne 0 ]; then
    echo "usage: $0 [--uninstall]" >&2
    exit 2
fi

EXE="$BUNDLE/r1desk"
ASSETS="$BUNDLE/_internal/assets"
TEMPLATE="$ASSETS/r1desk.desktop.in"
if [ ! -x "$EXE" ] || [ ! -f "$TEMPLATE" ]; then
    echo "install.sh: run me from the r1desk folder (next to the r1desk program); $EXE not found" >&2
    exit 1
fi

for size in $SIZES; do
    mkdir -p "$ICONS/${size}x${size}/apps"
    cp "$ASSETS/r1desk-$size.png" "$ICONS/${size}x${size}/apps/r1desk.png"
done
mkdir -p "$ICONS/scalable/apps" "$APPS"
cp "$ASSETS/r1desk.svg" "$ICONS/scalable/apps/r1desk.svg"

# sed: in the replacement, & \ and the | delimiter must be escaped.
exec_line=$(exec_value "$EXE" | sed -e 's/[\\&|]/\\&/g')
sed -e "s|@EXEC@|$exec_line|" "$TEMPLATE" > "$ENTRY.tmp"
chmod 644 "$ENTRY.tmp"
mv "$ENTRY.tmp" "$ENTRY"
refresh
echo "r1desk: added to your application menu ($ENTRY). Uninstall: $0 --uninstall"
