#!/usr/bin/env bash
# Coverage-guided fuzzing on the stable toolchain: what `cargo fuzz run` does, spelled out.
#
#   fuzz/run.sh TARGET SECONDS [extra libFuzzer flags...]
#   fuzz/run.sh all SECONDS          # every target in turn (by hand; not in CI: see
#                                    # RELIABILITY.md for why and how)
#
# Builds the target with libFuzzer's coverage instrumentation (sancov: 8-bit counters,
# PC table, compare tracing; all stable `-C` flags) and AddressSanitizer. The sanitizer
# flag is the one unstable option: RUSTC_BOOTSTRAP=1 lets the stable compiler accept it;
# the ASan runtime ships with the x86_64 Linux standard library. Set FUZZ_ASAN=0 to build
# without it (faster, still coverage-guided). The corpus grows in fuzz/corpus/TARGET and
# a crash is saved in fuzz/artifacts/TARGET/ (both ignored by git; a crash becomes a
# named regression test next to the fix). Exit status: non-zero on a crash.
set -euo pipefail
cd "$(dirname "$0")"
target="${1:?usage: fuzz/run.sh TARGET|all SECONDS [libFuzzer flags]}"
secs="${2:?seconds}"
shift 2
if [ "$target" = all ]; then
  for t in http_head publish_body ws_frames pusher_rest jwt_token; do "$0" "$t" "$secs" "$@"; done
  exit 0
fi
triple="$(rustc -vV | sed -n 's/^host: //p')"
flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags="$flags -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags="$flags -Cllvm-args=-sanitizer-coverage-pc-table"
flags="$flags -Cllvm-args=-sanitizer-coverage-trace-compares"
flags="$flags -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers"
if [ "${FUZZ_ASAN:-1}" = 1 ]; then
  export RUSTC_BOOTSTRAP=1
  flags="$flags -Zsanitizer=address"
fi
# An explicit --target keeps build scripts and proc macros uninstrumented.
RUSTFLAGS="$flags" cargo build --release --quiet --target "$triple" --bin "$target"
mkdir -p "corpus/$target" "artifacts/$target"
# Seeds: hand-written valid inputs, so the first minutes are not spent finding "GET".
if [ -d "seeds/$target" ]; then cp -n "seeds/$target"/* "corpus/$target/" 2>/dev/null || true; fi
exec "target/$triple/release/$target" "corpus/$target" \
  -artifact_prefix="artifacts/$target/" -max_total_time="$secs" -print_final_stats=1 \
  -max_len=4096 "$@"
