#!/usr/bin/env bash
# asyncio.sh BUILD_DIR BASE_PORT: Python asyncio echo servers and clients written for this test
# (asyncio_echo.py; datagram endpoints and streams on the default epoll event loop), both ends
# python: UDP on 127.0.0.1:BASE_PORT and TCP on BASE_PORT+1; natively, then with both ends
# preloaded. A run passes when
#   - UDP: 500 ping-pongs of random datagrams (1-1400 B) come back byte-exact, then a burst of
#     100 datagrams sent at once comes back whole (100 of 100), and both ends exit 0;
#   - TCP: 1000 ping-pongs of 64 B come back exact, then 32 MiB of random bytes streamed in
#     64 KiB writes (drained) come back byte for byte (sha256), and both ends exit 0;
#   - preloaded: UDP both ends' summaries show every datagram framed (tx/rx_framed > 0,
#     tx/rx_plain = 0); TCP both ends' show the connection carried over RC (rc_conns > 0,
#     rc_plain = 0).
# Prints the ratios preloaded/native of the ping-pong rates and of the TCP echo throughput.
# Exit 0 pass, 1 fail, 77 only if python3 cannot be installed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=apps_lib.sh
. "$here/apps_lib.sh"
apps_init asyncio "$@"
apps_need /usr/bin/python3 python3
apps_echo asyncio asyncio_echo UDP TCP /usr/bin/python3 "$here/asyncio_echo.py"
