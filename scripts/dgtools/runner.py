"""How the benches run: SIGTERM and SIGHUP end them through SystemExit (so every finally clause,
and with it the cleanup, runs), Ctrl-C exits 130, the cleanup always runs."""
import signal


def on_term(sig, frame):
    raise SystemExit(128 + sig)


def trap_term():
    """SIGTERM and SIGHUP raise SystemExit(128 + the signal's number)."""
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)


def run(main, cleanup):
    """main()'s exit status (130 on KeyboardInterrupt), after cleanup() ran."""
    try:
        rc = main()
    except KeyboardInterrupt:
        rc = 130
    finally:
        cleanup()
    return rc
