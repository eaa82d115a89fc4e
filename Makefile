# Makefile for the idempotency extension (PGXS)

EXTENSION = idempotency
EXTVERSION = $(shell grep default_version $(EXTENSION).control | sed -e "s/default_version[[:space:]]*=[[:space:]]*'\([^']*\)'/\1/")

MODULE_big = idempotency
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))

DATA = $(sort $(wildcard $(EXTENSION)--*.sql))

# pg_regress: sql/*.sql against expected/*.out, on a throwaway instance
REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --temp-config=test/idempotency.conf \
	--temp-instance=./tmp_check_regress --port=$(TEST_PORT)

# pg_isolation_regress: specs/*.spec against expected/*.out, the one
# expected/ of both suites (as in contrib); PGXS puts its results in
# output_iso/
ISOLATION = $(patsubst specs/%.spec,%,$(sort $(wildcard specs/*.spec)))
ISOLATION_OPTS = --temp-config=test/idempotency.conf \
	--temp-instance=./tmp_check_iso --port=$(TEST_PORT_ISO)

# TAP tests (PostgreSQL::Test::Cluster) live in test/t
TAP_TESTS = 1
PROVE_TESTS = $(sort $(wildcard test/t/*.pl))

TEST_PORT ?= 54391
TEST_PORT_ISO ?= 54392
TEST_PORT_ISO_PRELOAD ?= 54396

# The isolation specs a second time, on a server that preloads the library
# (test/idempotency-preload.conf): the digest filters (src/filter.h) exist
# only in shared memory.  Same expected/, its own instance, port and
# output_iso_preload/; ISOLATION= turns both passes off, ISOLATION_PRELOAD=
# this one only.  Specs that need a worker slot for a storage maker (the
# preload pass leaves none: see its configuration) run in the first pass
# only.
ISOLATION_NEEDS_MAKERS = outbox_first_use
ISOLATION_PRELOAD = $(filter-out $(ISOLATION_NEEDS_MAKERS),$(ISOLATION))
ISOLATION_PRELOAD_OPTS = --temp-config=test/idempotency-preload.conf \
	--temp-instance=./tmp_check_iso_preload --port=$(TEST_PORT_ISO_PRELOAD)

EXTRA_CLEAN = tmp_check_regress tmp_check_iso output_iso results regression.diffs regression.out \
	tmp_check_iso_preload output_iso_preload

PG_CPPFLAGS = -I$(srcdir)/src -DIDEM_VERSION=\"$(EXTVERSION)\"

# set before anything below runs it
PG_CONFIG ?= pg_config

# A syscache on pg_extension (PostgreSQL 16+, and back-patched into later
# 15.x minor releases) lets src/library_version.c notice ALTER EXTENSION
# UPDATE at once; without one it checks once per transaction.
ifneq (,$(shell grep -qs EXTENSIONOID $(addprefix $(shell $(PG_CONFIG) --includedir-server)/,utils/syscache.h catalog/syscache_ids.h catalog/pg_extension.h) && echo yes))
PG_CPPFLAGS += -DIDEM_HAVE_EXTENSION_SYSCACHE
endif
PG_CFLAGS = -Wno-unused-parameter

# SHA-256 straight from OpenSSL (src/keyhash.c) when PostgreSQL is built
# with it, as every Debian and PGDG build is
ifneq (,$(findstring -lcrypto,$(shell $(PG_CONFIG) --libs)))
SHLIB_LINK += -lcrypto
endif

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# IDEM_VERSION comes from the control file: a new version rebuilds
$(OBJS): $(EXTENSION).control

# pgTAP contract tests, against the server named by PGHOST/PGPORT
.PHONY: pgtap
pgtap:
	pg_prove --ext .sql -v test/pgtap/

ifeq ($(shell test $(VERSION_NUM) -lt 150000 && echo old),old)
$(error idempotency requires PostgreSQL 15 or later)
endif

# The release archive PGXN takes: $(EXTENSION)-$(EXTVERSION).zip (tools/dist.sh)
.PHONY: dist
dist:
	bash $(srcdir)/tools/dist.sh

# (ifneq, not ifdef: ISOLATION_PRELOAD is "$(ISOLATION)" unexpanded)
ifneq ($(strip $(ISOLATION_PRELOAD)),)
installcheck: installcheck-isolation-preload
endif
.PHONY: installcheck-isolation-preload
installcheck-isolation-preload:
	echo "+++ isolation install-check, library preloaded +++" && \
	$(top_builddir)/src/test/isolation/pg_isolation_regress \
	    --inputdir=$(srcdir) --outputdir=output_iso_preload \
	    --bindir='$(bindir)' $(pg_regress_locale_flags) $(EXTRA_REGRESS_OPTS) \
	    $(ISOLATION_PRELOAD_OPTS) $(ISOLATION_PRELOAD)

# every object depends on the headers of src/ (one per subsystem: a
# header's change rebuilds every file, whichever includes it)
$(OBJS): $(wildcard src/*.h)
include $(srcdir)/test/release.mk
