/*-------------------------------------------------------------------------
 *
 * wait.c
 *	  Waiting for the holder of a two-phase claim: a duplicate claim made
 *	  with wait => true and idempotency.wait_timeout > 0 sleeps until the
 *	  holder completes or releases the key, its lease lapses, or the wait's
 *	  bound is reached.
 *
 * The holder's transaction is over (its claim committed), so there is no
 * lock to wait on.  With shared_preload_libraries, shared memory holds a
 * fixed array of wake-up slots, each a change counter and a condition
 * variable; a key maps to one slot by its key lock's tag (keyed with the
 * database's secret, keyhash.c: no other role can tell which slot a key
 * uses, nor so wait on a slot of its own choice to learn when another
 * role completes a guessed key).  A completion
 * or release notes the key's slot, and when its transaction commits (or is
 * prepared: the waiter then finds the row busy and waits for the prepared
 * transaction as for any writer) bumps the counter and wakes the slot's
 * sleepers.  A waiter reads its slot's counter while it holds the key
 * lock, after it has seen the holder's claim: the holder cannot change the
 * row before the waiter lets go of the key lock, so the bump comes after
 * the read and no wake-up is missed.  Keys that share a slot wake each
 * other; a waiter woken for another key probes again and goes back to
 * sleep.  A checkpoint changes nothing a waiter waits for, and wakes none.
 *
 * Without preload there is no shared memory to sleep on: a waiter polls,
 * probing again after 1 ms, then twice as long each time, never more than
 * 50 ms.
 *
 * Either way the sleep ends at the lease's end or the wait's deadline, is
 * cancellable, and keeps nothing across transactions: a waiter holds no
 * key lock while it sleeps, and no state outlives the call, so it works
 * the same through a transaction-pooling connection pooler.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/wait.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "wait.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "port/pg_bitutils.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* Wake-up slots in shared memory (a power of two) */
#define IDEM_WAKE_SLOTS			1024

/* Polling without preload: first and longest sleep, in milliseconds */
#define IDEM_POLL_FIRST_MS		1
#define IDEM_POLL_MAX_MS		50

typedef struct IdemWakeSlot
{
	pg_atomic_uint64 changes;	/* bumped by each completion or release */
	ConditionVariable cv;		/* its sleepers */
} IdemWakeSlot;

static IdemWakeSlot *idem_wake_slots = NULL;

/*
 * The slots this transaction's completions and releases wake when it
 * commits, one bit each; allocated in TopTransactionContext when first
 * needed.
 */
static uint64 *pending_wakes = NULL;
static bool pending_any = false;

static void IdemWaitXactCallback(XactEvent event, void *arg);

/* the slot of a key, by its key lock's tag (IdemSetKeyLockTag) */
static int
IdemWakeSlotFor(const LOCKTAG *keytag)
{
	uint32		h = hash_bytes_uint32(keytag->locktag_field3);

	h = hash_combine(h, keytag->locktag_field2);
	h = hash_combine(h, keytag->locktag_field1);
	return (int) (h & (IDEM_WAKE_SLOTS - 1));
}

Size
IdemWaitShmemSize(void)
{
	return mul_size(IDEM_WAKE_SLOTS, sizeof(IdemWakeSlot));
}

/*
 * IdemWaitShmemInit attaches to (or creates) the wake-up slots.  Called
 * from the shmem_startup hook with AddinShmemInitLock held.
 */
void
IdemWaitShmemInit(void)
{
	bool		found;
	int			i;

	idem_wake_slots = ShmemInitStruct("idempotency wake-up slots",
									  IdemWaitShmemSize(), &found);
	if (found)
		return;
	for (i = 0; i < IDEM_WAKE_SLOTS; i++)
	{
		pg_atomic_init_u64(&idem_wake_slots[i].changes, 0);
		ConditionVariableInit(&idem_wake_slots[i].cv);
	}
}

/* Called once from _PG_init */
void
IdemWaitInit(void)
{
	RegisterXactCallback(IdemWaitXactCallback, NULL);
}

/*
 * IdemWaitSeen returns the change count of a key's slot, to be read with
 * the key lock held before a wait (0 without preload).
 */
uint64
IdemWaitSeen(const LOCKTAG *keytag)
{
	if (idem_wake_slots == NULL)
		return 0;
	return pg_atomic_read_u64(&idem_wake_slots[IdemWakeSlotFor(keytag)].changes);
}

/*
 * IdemWaitNoteChange notes that this transaction completed or released a
 * key: its waiters are woken when the transaction commits.
 */
void
IdemWaitNoteChange(const LOCKTAG *keytag)
{
	int			slot;

	if (idem_wake_slots == NULL)
		return;
	if (pending_wakes == NULL)
		pending_wakes = MemoryContextAllocZero(TopTransactionContext,
											   IDEM_WAKE_SLOTS / 64 * sizeof(uint64));
	slot = IdemWakeSlotFor(keytag);
	pending_wakes[slot / 64] |= UINT64CONST(1) << (slot % 64);
	pending_any = true;
}

/* wakes the slots of the transaction's changes when it commits */
static void
IdemWaitXactCallback(XactEvent event, void *arg)
{
	int			w;

	if (!pending_any)
		return;
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PREPARE)
	{
		for (w = 0; w < IDEM_WAKE_SLOTS / 64; w++)
		{
			uint64		bits = pending_wakes[w];

			while (bits != 0)
			{
				int			b = pg_rightmost_one_pos64(bits);
				IdemWakeSlot *slot = &idem_wake_slots[w * 64 + b];

				pg_atomic_fetch_add_u64(&slot->changes, 1);
				ConditionVariableBroadcast(&slot->cv);
				bits &= bits - 1;
			}
		}
	}
	else if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT)
		return;
	/* the memory goes with TopTransactionContext */
	pending_wakes = NULL;
	pending_any = false;
}

/*
 * IdemWaitForHolder sleeps until the key's slot changes from "seen", the
 * time "until" is reached, or (without preload) the polling interval
 * *poll_ms is over, which then doubles up to its bound.  The caller holds
 * no key lock, and probes again afterwards.
 */
void
IdemWaitForHolder(const LOCKTAG *keytag, uint64 seen, TimestampTz until,
				  int *poll_ms)
{
	IdemWakeSlot *slot;
	long		ms;

	if (idem_wake_slots == NULL)
	{
		ms = Min(TimestampDifferenceMilliseconds(GetCurrentTimestamp(), until),
				 INT_MAX - 1) + 1;
		if (*poll_ms < IDEM_POLL_FIRST_MS)
			*poll_ms = IDEM_POLL_FIRST_MS;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(ms, *poll_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		*poll_ms = Min(*poll_ms * 2, IDEM_POLL_MAX_MS);
		return;
	}

	slot = &idem_wake_slots[IdemWakeSlotFor(keytag)];
	ConditionVariablePrepareToSleep(&slot->cv);
	while (pg_atomic_read_u64(&slot->changes) == seen)
	{
		TimestampTz now = GetCurrentTimestamp();

		if (now >= until)
			break;
		/* rounded up: woken at "until" or just after, never before */
		ms = Min(TimestampDifferenceMilliseconds(now, until), INT_MAX - 1) + 1;
		(void) ConditionVariableTimedSleep(&slot->cv, ms, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
}
