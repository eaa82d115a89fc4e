#!/usr/bin/env python3
#
# examples/http/recoverer.py -- finishes the charges of examples/http/server.py
# whose server died (or gave up) between the claim and the completion.
#
#   python3 examples/http/recoverer.py [--dsn 'dbname=payments'] [--once]
#
# server.py claims each key with a lease and keep_request => true, so a key
# whose server was killed mid-charge keeps its request and, once the lease
# has lapsed, can be taken over.  Each round:
#
#   BEGIN;
#   SELECT key, scope, token, recovery_point, request
#     FROM idem_recover(lease => <--lease>, scope => NULL, max_keys => 10);
#   COMMIT;
#   -- for each key, as server.py's phase 2 does:
#   -- the card network call with the key's card network key (its recovery
#   -- point): a charge the dead server made is found, not made again
#   BEGIN;
#   INSERT INTO charges ...;    -- the account is in the scope
#   SELECT idem_complete(key, 201, scope => ..., token => token,
#                        response_headers => ..., response_raw => ...);
#   COMMIT;
#
# A client retrying later gets the stored response, as if its server had
# answered.  Any number of recoverers may run: idem_recover() hands each
# lapsed key to one of them.  SIGTERM or SIGINT: the key in hand is
# finished, then the process exits with status 0; keys of the batch not yet
# started lapse again after --lease and are taken by the next round.
# --once: rounds until none is left to take over, then exit (status 1 if a
# key failed).  Connection settings: --dsn and the PG* environment.
#
# Standard library + psycopg 3 only (Debian: python3-psycopg).

import argparse
import signal
import sys
import threading

import payments


def log(msg):
    sys.stderr.write("recoverer: %s\n" % msg)
    sys.stderr.flush()


class Recoverer:

    def __init__(self, opts):
        self.opts = opts
        self.pool = payments.Pool(opts.dsn, 1, "payments-recoverer")
        self.network = payments.CardNetwork(opts.dsn, 1)
        self.stop = threading.Event()
        self.completed = 0
        self.failed = 0

    def take_over(self):
        """One transaction: take up to --batch lapsed keys over."""
        with self.pool.connection() as conn, conn.transaction():
            return conn.execute(
                "SELECT key, scope, token, recovery_point, request, lapsed_at "
                "  FROM idem_recover(make_interval(secs => %s), NULL, %s)",
                (self.opts.lease, self.opts.batch)).fetchall()

    def finish(self, key, scope, token, recovery_point, request):
        """Phase 2 of one taken-over charge; True if the key is completed."""
        if payments.account_of(scope) is None:
            # not a charge: this role's keys are all server.py's
            log("key %r of scope %r is not a charge; left alone" % (key, scope))
            return False
        try:
            provider_key = payments.provider_key_of(recovery_point)
            if provider_key is None:
                # claimed without one (not by server.py, which records it
                # with the claim): the card network was never called
                with self.pool.connection() as conn:
                    provider_key = payments.new_provider_key(conn, key, scope,
                                                             token)
            response = payments.make_charge(self.pool, self.network, key,
                                            scope, token, provider_key,
                                            request)
        except payments.TakenOver:
            # our lease lapsed and someone else finishes it
            log("key %r of %r was taken over meanwhile" % (key, scope))
            return False
        except payments.CardNetworkUnavailable as e:
            log("key %r of %r: %s; trying again after the lease" %
                (key, scope, e))
            return False
        except Exception as e:          # noqa: BLE001 -- log, go on
            log("key %r of %r failed: %r; trying again after the lease" %
                (key, scope, e))
            return False
        log("completed key %r of %r with %d" % (key, scope, response.code))
        return True

    def round(self):
        """Take keys over and finish them; the number taken over."""
        rows = self.take_over()
        for i, (key, scope, token, rp, request, lapsed_at) in enumerate(rows):
            if self.stop.is_set():
                log("stopping: %d key(s) taken over are left for the next "
                    "run (after the lease)" % (len(rows) - i))
                break
            log("took over key %r of %r (lease lapsed at %s)" %
                (key, scope, lapsed_at.isoformat()))
            if self.finish(key, scope, token, rp, request):
                self.completed += 1
            else:
                self.failed += 1
        return len(rows)

    def run(self):
        while not self.stop.is_set():
            try:
                taken = self.round()
            except Exception as e:      # noqa: BLE001 -- database down, ...
                log("round failed: %r" % e)
                if self.opts.once:
                    return 1
                taken = 0
            if self.opts.once and taken == 0:
                break
            if taken < self.opts.batch:
                self.stop.wait(self.opts.interval)
        log("stopped: %d completed, %d failed" % (self.completed, self.failed))
        return 1 if self.opts.once and self.failed else 0


def main():
    ap = argparse.ArgumentParser(
        description="Finish the charges of examples/http/server.py whose "
                    "server died mid-charge.")
    ap.add_argument("--dsn", default="",
                    help="libpq connection string (default: PG* environment)")
    ap.add_argument("--lease", type=payments.positive_duration, default=30.0,
                    help="lease of a taken-over key: long enough for a "
                         "batch of card network calls (default 30s)")
    ap.add_argument("--batch", type=int, default=10,
                    help="keys taken over per round (default 10)")
    ap.add_argument("--interval", type=payments.positive_duration,
                    default=1.0,
                    help="pause after a round that found less than a batch "
                         "(default 1s)")
    ap.add_argument("--once", action="store_true",
                    help="stop when no lapsed key is left (for tests, cron)")
    opts = ap.parse_args()
    if opts.batch < 1:
        ap.error("--batch must be at least 1")

    recoverer = Recoverer(opts)

    def stop(signum, frame):
        recoverer.stop.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log("running (lease %s, batch %d%s)" %
        (payments.human_interval(opts.lease), opts.batch,
         ", once" if opts.once else ""))
    sys.exit(recoverer.run())


if __name__ == "__main__":
    main()
