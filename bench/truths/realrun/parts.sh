# shellcheck shell=bash
# What a real run that takes longer than one machine's lease needs to run in parts (sourced by its
# run.sh: bench/truths/realrun/t1lr/, t2/): start it in the background, stop it (SIGTERM: the running
# trial is saved between two steps), and save its live database and checkpoints into the checkout, to
# be committed; a start on a new machine resumes from the committed copy.
#
# The caller sets HERE (its folder in the checkout), WORK (the live copy, outside it) and DB (the
# database's file name), defines launch (the `archhpo run` command, exec'd, with --storage
# sqlite:///$WORK/$DB and --checkpoint-dir $WORK/ck) and ends with: parts "$@"

save() {
  [[ -f $WORK/$DB ]] || { echo "no $WORK/$DB to save" >&2; return 1; }
  sqlite3 -cmd ".timeout 60000" "$WORK/$DB" ".backup '$HERE/$DB.tmp'" && mv "$HERE/$DB.tmp" "$HERE/$DB"
  # the interrupted trial's checkpoint too: a large budget's trial is hours of a worker, resumed from it
  rm -rf "$HERE/ck.tmp" && if [[ -d $WORK/ck ]]; then cp -r "$WORK/ck" "$HERE/ck.tmp"; else mkdir -p "$HERE/ck.tmp"; fi
  rm -rf "$HERE/ck" && mv "$HERE/ck.tmp" "$HERE/ck"
  echo "$(date -u +%FT%TZ) saved $DB" >&2
}

restore() {  # a new machine: the committed copy
  mkdir -p "$WORK"
  if [[ ! -s $WORK/$DB && -f $HERE/$DB ]]; then
    cp "$HERE/$DB" "$WORK/$DB"
    rm -rf "$WORK/ck" && if [[ -d $HERE/ck ]]; then cp -r "$HERE/ck" "$WORK/ck"; fi
  fi
}

parts() {
  case "${1:-}" in
    start) mkdir -p "$WORK"; nohup "$0" run >>"$WORK/run.log" 2>&1 & echo $! >"$WORK/run.pid"
           echo "started (log $WORK/run.log)" >&2 ;;
    run) restore; launch ;;
    stop) if [[ -f $WORK/run.pid ]]; then pid=$(cat "$WORK/run.pid"); kill -TERM "$pid" 2>/dev/null || true
            while kill -0 "$pid" 2>/dev/null; do sleep 1; done; rm -f "$WORK/run.pid"; fi; save ;;
    save) save ;;
    *) echo "usage: $0 start|stop|save" >&2; exit 2 ;;
  esac
}
