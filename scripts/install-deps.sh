#!/usr/bin/env bash
# Installs the Debian 12 packages kvlattice builds and tests with, only those that are missing.
set -euo pipefail
packages=(build-essential cmake ninja-build libfmt-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libgmock-dev ccache clang-14 libclang-rt-14-dev libxxhash-dev libzstd-dev
          libcpp-httplib-dev lld libhiredis-dev redis-server
          liburing-dev        # liburing-dev: the disk tier's reads through io_uring (optional at build)
          python3             # python3 (its standard library): scripts/soak, the serve soak (ctest)
          libboost-dev        # libboost-dev: Boost.Beast/Asio, kvl serve's HTTP transport
          pkg-config libzmq3-dev cppzmq-dev libmsgpack-cxx-dev  # kvl serve --kv-events (vLLM's KV events)
          python3-zmq python3-msgpack  # the KV events' subscriber test (tests/events)
          python3-matplotlib  # python3-matplotlib: scripts/plot_turns.py (kvl bench turns --plot)
          unicode-data        # UnicodeData.txt: scripts/gen_unicode_tables.py (the table is committed)
          chromium)           # chromium: the web page's browser tests (tests/webui)
# Those tests drive chromium with puppeteer-core from npm; the chat-template tests run the
# reference renderer (@huggingface/jinja), the tokenizer tests fetch llama.cpp's vocabularies and
# the openai client test its SDK under node. A node that brings its own npm (NodeSource's) needs
# no Debian npm, which would conflict with it.
command -v npm > /dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "kvl: installing Debian packages: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
