# test/release.mk -- the quality gates run before each release, included by
# the Makefile.  Not run by CI: each takes from minutes to more than an
# hour.  They run as root (they build the assert-enabled server and install
# the extension into it); test/release.sh does the work and says what each
# gate checks, doc/testing.md#before-a-release what they found last.
#
#   make valgrind           regress and isolation under Valgrind's memcheck
#   make discard-caches     partition tests with debug_discard_caches = 1
#                           (DISCARD_CACHES_SECONDS: the budget)
#   make sqlsmith           sqlsmith on the assert-enabled 15 and on 15, 17,
#                           18 (SQLSMITH_SECONDS per role and server,
#                           default 600; SQLSMITH_SERVERS)
#   make calendar           the calendar sweep (test/calendar.sh), as an
#                           ordinary user: every suite that can depend on
#                           the date at every point of its list (40 min)
#   make amcheck            amcheck over every ledger index of the database
#                           named by PGHOST, PGPORT, PGDATABASE

RELEASE_SH = bash $(srcdir)/test/release.sh

.PHONY: valgrind discard-caches sqlsmith amcheck
valgrind:
	$(RELEASE_SH) valgrind

discard-caches:
	$(RELEASE_SH) discard-caches

sqlsmith:
	$(RELEASE_SH) sqlsmith

amcheck:
	$(RELEASE_SH) amcheck

# The calendar sweep (test/calendar.sh): regress, pgTAP, isolation and the
# worker's and expiry's TAP tests at every point of its list and a random
# one, against the installed extension; as an ordinary user (it starts
# servers).  CI runs a rotating part of it (the "calendar" suite).
.PHONY: calendar
calendar:
	bash $(srcdir)/test/calendar.sh
