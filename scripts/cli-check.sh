#!/usr/bin/env bash
# Scripted check: the published Iggy CLI (iggy-cli 0.14.0) against a real Cairn server.
#
#   scripts/cli-check.sh            # installs the CLI into target/iggy-cli if needed
#   IGGY_CLI=/path/to/iggy scripts/cli-check.sh
#
# Starts `cairn serve` on ephemeral loopback ports with a fresh data dir, runs the CLI's
# stream / topic / partition / message / consumer-group / consumer-offset / user / pat / client /
# me / stats commands, and checks each one's exit status and the output it prints. Then it
# checks permissions as seen through the CLI (a read-only user, its token), stops the server
# with SIGTERM and requires `cairn check` to report the data dir healthy.
#
# Not part of `cargo test` (installing the CLI compiles ~400 crates): `.ci/run` installs it
# and runs this after the tests.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

cli_version="0.14.0"
if [[ -z "${IGGY_CLI:-}" ]]; then
    IGGY_CLI="$repo/target/iggy-cli/bin/iggy"
    if ! "$IGGY_CLI" --version 2>/dev/null | grep -q "$cli_version"; then
        echo "== installing iggy-cli $cli_version into target/iggy-cli (one-off, slow)"
        cargo install iggy-cli --version "$cli_version" --locked --root "$repo/target/iggy-cli"
    fi
fi
"$IGGY_CLI" --version | grep -q "$cli_version" || {
    echo "FAIL: $IGGY_CLI is not iggy-cli $cli_version" >&2
    exit 1
}

echo "== building cairn"
cargo build -p cairn --quiet
cairn="$repo/target/debug/cairn"

work="$(mktemp -d)"
data_dir="$work/data"
server_out="$work/server.out"
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill -KILL "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

root_password="cli-check-$RANDOM-$RANDOM"
CAIRN_ROOT_PASSWORD="$root_password" "$cairn" serve --data-dir "$data_dir" \
    --tcp-address 127.0.0.1:0 --http-address 127.0.0.1:0 >"$server_out" 2>"$work/server.err" &
server_pid=$!
for _ in $(seq 1 300); do
    grep -q '^CAIRN_READY' "$server_out" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.err" >&2; echo "FAIL: server exited" >&2; exit 1; }
    sleep 0.1
done
tcp_addr="$(sed -n 's/^CAIRN_READY tcp=\([^ ]*\) .*/\1/p' "$server_out")"
[[ -n "$tcp_addr" ]] || { echo "FAIL: server never printed CAIRN_READY" >&2; exit 1; }
echo "== cairn serving on $tcp_addr"

passed=0
failed=0
last_output=""

# run <expect: ok|fail> <description> <regex the output must match> -- <iggy args...>
run() {
    local expect="$1" description="$2" pattern="$3"
    shift 4
    local status=0
    # The CLI warns on stderr when no desktop keyring is available; only its stdout is checked.
    last_output="$(RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0 "$IGGY_CLI" --tcp-server-address "$tcp_addr" "$@" 2>"$work/cli.err")" || status=$?
    local ok=1
    if [[ "$expect" == ok && $status -ne 0 ]]; then ok=0; fi
    if [[ "$expect" == fail && $status -eq 0 ]]; then ok=0; fi
    local combined="$last_output"$'\n'"$(grep -v 'keyring backend unavailable' "$work/cli.err" || true)"
    if [[ -n "$pattern" ]] && ! grep -Eq -- "$pattern" <<<"$combined"; then ok=0; fi
    if [[ $ok -eq 1 ]]; then
        passed=$((passed + 1))
        echo "ok   $description"
    else
        failed=$((failed + 1))
        echo "FAIL $description (exit $status, expected $expect, pattern /$pattern/)"
        sed 's/^/     | /' <<<"$combined"
    fi
}

root=(-u iggy -p "$root_password")

run ok "ping (no login)" "ping" -- ping
run ok "stream create" "created" -- "${root[@]}" stream create orders
run ok "stream create (second)" "created" -- "${root[@]}" stream create audit
run ok "stream list shows both" "orders.*|audit" -- "${root[@]}" stream list
run ok "stream get" "orders" -- "${root[@]}" stream get orders
run ok "stream update (rename)" "" -- "${root[@]}" stream update audit audit-log
run ok "stream list shows the new name" "audit-log" -- "${root[@]}" stream list
run fail "stream create duplicate is refused" "already exists" -- "${root[@]}" stream create orders
run ok "topic create" "partitions count: 2" -- "${root[@]}" topic create orders eu 2 none
run ok "topic list" "eu" -- "${root[@]}" topic list orders
run ok "topic get" "Partitions count +\| 2" -- "${root[@]}" topic get orders eu
run ok "partition create" "Created 2 partitions" -- "${root[@]}" partition create orders eu 2
run ok "topic get shows 4 partitions" "Partitions count +\| 4" -- "${root[@]}" topic get orders eu
run ok "partition delete" "" -- "${root[@]}" partition delete orders eu 1
run ok "topic get shows 3 partitions" "Partitions count +\| 3" -- "${root[@]}" topic get orders eu
run ok "message send to partition 0" "Sent messages" -- "${root[@]}" message send --partition-id 0 orders eu alpha beta gamma
run ok "message poll from offset 0" "alpha" -- "${root[@]}" message poll --offset 0 --message-count 3 orders eu 0
run ok "message poll shows all three" "gamma" -- "${root[@]}" message poll --offset 0 --message-count 3 orders eu 0
run ok "message poll last" "gamma" -- "${root[@]}" message poll --last --message-count 1 orders eu 0
run ok "message flush" "" -- "${root[@]}" message flush orders eu 0
run ok "topic get counts 3 messages" "Topic message count +\| 3" -- "${root[@]}" topic get orders eu
run ok "consumer-offset set" "" -- "${root[@]}" consumer-offset set 7 orders eu 0 1
run ok "consumer-offset get" "Stored offset +\| 1" -- "${root[@]}" consumer-offset get 7 orders eu 0
run ok "consumer-group create" "" -- "${root[@]}" consumer-group create orders eu workers
run ok "consumer-group list" "workers" -- "${root[@]}" consumer-group list orders eu
run ok "consumer-group get" "workers" -- "${root[@]}" consumer-group get orders eu workers
run ok "me" "Transport +\| TCP" -- "${root[@]}" me
run ok "client list" "TCP" -- "${root[@]}" client list
run ok "stats counts streams" "Streams Count +\| 2" -- "${root[@]}" stats
run ok "stats counts messages" "Message Count +\| 3" -- "${root[@]}" stats

# Users, permissions and tokens.
run ok "user create (read-only on orders)" "" -- "${root[@]}" user create reader "reader-pass-1" -s "0:read_stream,poll_messages"
run ok "user list" "reader" -- "${root[@]}" user list
run ok "user get" "reader.*\\|"  -- "${root[@]}" user get reader
reader=(-u reader -p "reader-pass-1")
run ok "reader polls orders" "alpha" -- "${reader[@]}" message poll --offset 0 --message-count 1 orders eu 0
run fail "reader cannot send to orders" "Unauthorized" -- "${reader[@]}" message send --partition-id 0 orders eu refused
run ok "reader does not see audit-log" "orders" -- "${reader[@]}" stream list
if grep -q "audit-log" <<<"$last_output"; then
    failed=$((failed + 1)); echo "FAIL reader's stream list shows audit-log"
else
    passed=$((passed + 1)); echo "ok   reader's stream list hides audit-log"
fi
run fail "reader cannot create a stream" "Unauthorized" -- "${reader[@]}" stream create forbidden
run ok "reader creates a token" "Token: " -- "${reader[@]}" pat create reader-token
reader_token="$(sed -n 's/^Token: //p' <<<"$last_output" | tr -d '[:space:]')"
run ok "reader lists its token" "reader-token" -- "${reader[@]}" pat list
run ok "token login polls orders" "alpha" -- --token "$reader_token" message poll --offset 0 --message-count 1 orders eu 0
run fail "token login cannot send" "Unauthorized" -- --token "$reader_token" message send --partition-id 0 orders eu refused
run ok "user password change" "" -- "${root[@]}" user password reader "reader-pass-1" "reader-pass-2"
run fail "old password is refused" "Invalid credentials" -- "${reader[@]}" me
run ok "new password works" "Client ID" -- -u reader -p "reader-pass-2" me
run ok "user status inactive" "" -- "${root[@]}" user status reader inactive
run fail "inactive user cannot log in" "User inactive" -- -u reader -p "reader-pass-2" me
run ok "pat delete (root's view: its own tokens)" "" -- "${root[@]}" pat list
run ok "user delete" "" -- "${root[@]}" user delete reader
run fail "root user cannot be deleted" "[Cc]annot delete user|Unauthorized" -- "${root[@]}" user delete iggy
run ok "root still works after the delete" "User ID +\| 0" -- "${root[@]}" me

# Clean-up commands, then a clean stop and a healthy check.
run ok "consumer-group delete" "" -- "${root[@]}" consumer-group delete orders eu workers
run ok "topic purge" "" -- "${root[@]}" topic purge orders eu
run ok "purged topic counts 0 messages" "Topic message count +\| 0" -- "${root[@]}" topic get orders eu
run ok "topic delete" "" -- "${root[@]}" topic delete orders eu
run ok "stream delete" "" -- "${root[@]}" stream delete audit-log

kill -TERM "$server_pid"
wait "$server_pid" || { echo "FAIL: server exited non-zero on SIGTERM" >&2; failed=$((failed + 1)); }
server_pid=""
if "$cairn" check "$data_dir" >"$work/check.out" 2>&1; then
    passed=$((passed + 1)); echo "ok   cairn check after the clean stop"
else
    failed=$((failed + 1)); echo "FAIL cairn check after the clean stop"; sed 's/^/     | /' "$work/check.out"
fi

echo "== iggy-cli $cli_version against Cairn: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
