#!/usr/bin/env python3
"""bench/delay_proxy.py: a TCP proxy that adds a fixed latency per request/response turn.

Used by the s3_latency scenario (bench/src/scenarios/s3_latency.rs) to put a simulated network round trip between the backup tools
and a local S3 server (moto). Python 3.8+, standard library only.

Usage:
    delay_proxy.py --listen HOST:PORT --upstream HOST:PORT [--delay-ms 20]
                   [--connect-delay-ms 0] [--tls-listen HOST:PORT --tls-cert PEM --tls-key PEM]
                   [--stats FILE] [--log FILE] [--pid-file FILE]

Latency model (one round trip = --delay-ms, default 20 ms):
  * Each client connection is piped to its own upstream connection.
  * A "turn" starts when the client sends data after the server has sent data on that
    connection (or the client's first data on a new connection). The first chunk of each
    turn is held for --delay-ms before it is forwarded; the rest of the turn follows
    without further delay, in order. So every HTTP request/response exchange costs one
    extra round trip, whatever its size, and a request whose body is sent after an interim
    answer (Expect: 100-continue) costs two.
  * A new connection costs nothing extra by default (--connect-delay-ms 0): moto closes the
    connection after every response ("Connection: close"), so every request arrives on a new
    connection, whereas a real S3 endpoint keeps connections alive. Charging the TCP (and
    TLS) handshake would therefore charge a round trip per request that a real client
    reuses away. Give --connect-delay-ms to model it anyway; it is spent before the upstream
    connection is opened. With --tls-listen the proxy terminates TLS itself (the handshake
    costs CPU, not delay).
  * Bandwidth is not limited and server-to-client data is never delayed. Requests on
    different connections are delayed independently (in parallel), as on a real network.
  * When the server closes its side, the client connection is closed too.

Statistics: on SIGUSR1 the proxy writes a JSON line {"seq", "connections", "turns",
"bytes_up", "bytes_down"} to --stats FILE (atomically, via a temporary file); seq counts the
dumps, so a reader can wait for the dump it asked for. --log FILE appends one line per turn:
"<unix time> <connection number> <turn number> <first line of the turn>" (for HTTP: the
request line, then its Range and Content-Length headers as range=... content-length=...). SIGTERM/SIGINT stop it.
"""

import argparse
import asyncio
import json
import os
import signal
import ssl
import sys
import time

STATS = {"seq": 0, "connections": 0, "turns": 0, "bytes_up": 0, "bytes_down": 0}
LOG = None
BUF = 256 * 1024


def hostport(text):
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


class Conn:
    """State shared by the two directions of one proxied connection."""

    def __init__(self, number):
        self.number = number
        self.server_spoke = True  # so the client's first data starts a turn


async def pump_up(reader, writer, conn, delay):
    """client -> server; delays the first chunk of every turn."""
    try:
        while True:
            data = await reader.read(BUF)
            if not data:
                break
            if conn.server_spoke:
                conn.server_spoke = False
                STATS["turns"] += 1
                if LOG is not None:
                    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1", "replace").split("\r\n")
                    extra = "".join(f" {h.split(':', 1)[0].lower()}={h.split(':', 1)[1].strip()}" for h in head[1:]
                                    if h.lower().startswith(("range:", "content-length:")))
                    LOG.write(f"{time.time():.6f} {conn.number} {STATS['turns']} {head[0][:300]}{extra}\n")
                if delay > 0:
                    await asyncio.sleep(delay)
            STATS["bytes_up"] += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, asyncio.CancelledError):
        pass


async def pump_down(reader, writer, conn):
    """server -> client; never delayed."""
    try:
        while True:
            data = await reader.read(BUF)
            if not data:
                break
            conn.server_spoke = True
            STATS["bytes_down"] += len(data)
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, asyncio.CancelledError):
        pass


def close(writer):
    try:
        writer.close()
    except Exception:
        pass


async def handle(client_reader, client_writer, args):
    STATS["connections"] += 1
    number = STATS["connections"]
    sock = client_writer.get_extra_info("socket")
    if sock is not None:
        try:
            import socket
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    if args.connect_delay > 0:
        await asyncio.sleep(args.connect_delay)
    try:
        up_reader, up_writer = await asyncio.open_connection(*args.upstream)
    except OSError as e:
        print(f"delay_proxy: cannot connect to upstream {args.upstream}: {e}", file=sys.stderr)
        close(client_writer)
        return
    conn = Conn(number)
    up = asyncio.ensure_future(pump_up(client_reader, up_writer, conn, args.delay))
    down = asyncio.ensure_future(pump_down(up_reader, client_writer, conn))
    # When the server is done (it closed its side, as moto does after every response), the
    # client connection is closed completely: a TLS client cannot be half-closed, and a client
    # reading a response delimited by the end of the connection would wait forever. When the
    # client is done first, the server's answer is still forwarded until the server closes.
    done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
    if down in done:
        up.cancel()
    else:
        try:
            await asyncio.wait_for(down, timeout=300)
        except (asyncio.TimeoutError, Exception):
            down.cancel()
    close(up_writer)
    close(client_writer)


def dump_stats(path):
    STATS["seq"] += 1
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(STATS) + "\n")
    os.replace(tmp, path)


async def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=hostport, help="plain TCP listen address HOST:PORT")
    p.add_argument("--tls-listen", type=hostport, help="TLS listen address HOST:PORT (needs --tls-cert/--tls-key)")
    p.add_argument("--tls-cert", help="PEM certificate chain for --tls-listen")
    p.add_argument("--tls-key", help="PEM private key for --tls-listen")
    p.add_argument("--upstream", type=hostport, required=True, help="server HOST:PORT")
    p.add_argument("--delay-ms", type=float, default=20.0, help="delay per request/response turn (default 20)")
    p.add_argument("--connect-delay-ms", type=float, default=0.0,
                   help="delay before a new connection is forwarded (default 0)")
    p.add_argument("--stats", help="file written on SIGUSR1 (JSON counters)")
    p.add_argument("--log", help="append one line per request/response turn to this file")
    p.add_argument("--pid-file", help="write the process id here once listening")
    args = p.parse_args()
    if not args.listen and not args.tls_listen:
        p.error("give --listen and/or --tls-listen")
    if args.tls_listen and not (args.tls_cert and args.tls_key):
        p.error("--tls-listen needs --tls-cert and --tls-key")
    args.delay = args.delay_ms / 1000.0
    args.connect_delay = args.connect_delay_ms / 1000.0

    global LOG
    if args.log:
        LOG = open(args.log, "a", buffering=1)
    servers = []
    cb = lambda r, w: handle(r, w, args)  # noqa: E731
    if args.listen:
        servers.append(await asyncio.start_server(cb, *args.listen, backlog=1024))
    if args.tls_listen:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        servers.append(await asyncio.start_server(cb, *args.tls_listen, ssl=ctx, backlog=1024))

    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, lambda: stop.done() or stop.set_result(None))
    if args.stats:
        loop.add_signal_handler(signal.SIGUSR1, lambda: dump_stats(args.stats))
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    print(f"delay_proxy: listening on {args.listen or ''} {args.tls_listen or ''} -> "
          f"{args.upstream[0]}:{args.upstream[1]}, {args.delay_ms} ms per turn, "
          f"{args.connect_delay * 1000} ms per connection", file=sys.stderr, flush=True)
    await stop
    for s in servers:
        s.close()


if __name__ == "__main__":
    asyncio.run(main())
