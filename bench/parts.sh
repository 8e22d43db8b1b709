# shellcheck shell=bash
# Studies in parts, shared by bench/truths/truths.sh and bench/frontier/frontier.sh (sourced): a
# study's live SQLite database and checkpoints ($WORK/NAME.db, $WORK/NAME_ck, outside the checkout)
# and their committed copy ($SAVED), which the scripts copy back every 15 minutes and at every stop.

sql() { sqlite3 -cmd ".timeout 60000" "$@"; }  # waits for a busy database instead of failing the chain

restore_copy() {  # the working copy of $1: from the committed one when this machine has none
  local t=$1
  mkdir -p "$WORK"
  # -s, not -f: an empty file (sqlite3 creates one when it opens a missing path) is no working copy
  if [[ ! -s $WORK/$t.db && -f $SAVED/$t.db ]]; then
    cp "$SAVED/$t.db" "$WORK/$t.db"
    rm -rf "$WORK/${t}_ck" && if [[ -d $SAVED/${t}_ck ]]; then cp -r "$SAVED/${t}_ck" "$WORK/${t}_ck"; fi
    echo "restored $t from $SAVED" >&2
  fi
}

save() {  # the committed copy of $1: an online backup of the live database, then its checkpoints
  local t=$1
  mkdir -p "$SAVED"
  [[ -f $WORK/$t.db ]] || { echo "no $WORK/$t.db to save" >&2; return 1; }
  sql "$WORK/$t.db" ".backup '$SAVED/$t.db.tmp'" && mv "$SAVED/$t.db.tmp" "$SAVED/$t.db"
  rm -rf "$SAVED/${t}_ck.tmp"
  if [[ -d $WORK/${t}_ck ]]; then cp -r "$WORK/${t}_ck" "$SAVED/${t}_ck.tmp"; else mkdir -p "$SAVED/${t}_ck.tmp"; fi
  rm -rf "$SAVED/${t}_ck" && mv "$SAVED/${t}_ck.tmp" "$SAVED/${t}_ck"
  echo "$(date -u +%FT%TZ) saved $t" >&2
}

start_saver() {  # save $1 every 15 minutes in the background until `stop_saver $1`
  local t=$1
  ( while sleep 900; do save "$t" || true; done ) >>"$WORK/$t.saver.log" 2>&1 &
  echo $! >"$WORK/$t.saver.pid"
}

stop_saver() {  # stop $1's saver (its pid file removed)
  local t=$1
  if [[ -f $WORK/$t.saver.pid ]]; then kill "$(cat "$WORK/$t.saver.pid")" 2>/dev/null || true; rm -f "$WORK/$t.saver.pid"; fi
}
