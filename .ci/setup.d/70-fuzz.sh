# cargo-fuzz (the libFuzzer driver) for .ci/fuzz, pinned, built from crates.io with the
# machine's stable toolchain (~1.5 min once; a second run finds it installed and skips).
CARGO_FUZZ_VERSION=0.13.1
if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --quiet
fi
cargo fuzz --version
