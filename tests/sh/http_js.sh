#!/bin/sh
# tests/sh/http_js.sh: real clients against `cumulo serve` with an API key:
# the official openai npm package (tests/js/openai_sdk.mjs) and headless
# Chromium driven by playwright-core (tests/js/dashboard.mjs; screenshots in
# tests/artifacts/). Installs tests/js/node_modules from the lockfile when
# missing (scripts/setup.sh does it too); needs node and /usr/bin/chromium.
. "$(dirname "$0")/lib/http_common.sh"
need node

if [ ! -d tests/js/node_modules/openai ] || [ ! -d tests/js/node_modules/playwright-core ]; then
    (cd tests/js && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) || { tail -20 "$TMP/npm.log" >&2; bad "npm ci in tests/js failed"; finish; exit 1; }
fi
[ -x /usr/bin/chromium ] || { echo "skip: needs /usr/bin/chromium (scripts/setup.sh installs it)"; echo "$pass passed, $fail failed, 1 skipped"; exit 0; }

echo "# node $(node --version) (Debian 12 ships 18; the JS tests must pass on it as on newer ones)" >&2
start_server js --api-key jskey || { bad "server"; finish; exit 1; }
"$BIN" run "$MODEL" -p "Once upon a time" -n 40 --temp 0 --threads 1 --json >"$TMP/run.json" 2>/dev/null
want=$(js 'j.text' "$TMP/run.json")
node tests/js/openai_sdk.mjs "$URL" stories260K-q8_0 jskey "$want" >"$TMP/sdk.out" 2>"$TMP/sdk.err"
rc=$?
cat "$TMP/sdk.err" >&2
line=$(tail -1 "$TMP/sdk.out")
p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
[ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ] && bad "openai_sdk.mjs exited $rc"

mkdir -p tests/artifacts
node tests/js/dashboard.mjs "$URL" jskey tests/artifacts 1 >"$TMP/dash.out" 2>"$TMP/dash.err"
rc=$?
cat "$TMP/dash.err" >&2
line=$(tail -1 "$TMP/dash.out")
p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
[ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ] && bad "dashboard.mjs exited $rc"
check "screenshots saved" sh -c '[ -s tests/artifacts/dashboard.png ] && [ -s tests/artifacts/dashboard-chat.png ]'
stop_server "$PID"
finish
