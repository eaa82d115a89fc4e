/*-------------------------------------------------------------------------
 *
 * observe.c
 *	  Set-returning functions behind the extension's monitoring views.
 *
 * idempotency.partition_info() lists the partitions of every ledger with
 * the bounds this extension reads from their partition constraints; the
 * view idempotency.partitions adds sizes from the catalogs.
 *
 * Copyright (c) 2026, the idempotency authors
 *
 * IDENTIFICATION
 *	  src/observe.c
 *
 *-------------------------------------------------------------------------
 */
#include "idempotency.h"
#include "storage.h"

#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idem_partition_info);

/*
 * idempotency.partition_info(OUT table_name text, OUT partition regclass,
 *		OUT lanes int, OUT lane int, OUT lower_bound timestamptz,
 *		OUT upper_bound timestamptz)
 */
Datum
idem_partition_info(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			ledger;

	IdemCheckLibraryVersion();
	InitMaterializedSRF(fcinfo, 0);

	for (ledger = 0; ledger < IDEM_NUM_LEDGERS; ledger++)
	{
		List	   *partitions;
		ListCell   *lc;

		if (!IdemLedgerDefined(ledger))
			continue;
		partitions = IdemAllPartitions(ledger);
		foreach(lc, partitions)
		{
			IdemPartition *p = (IdemPartition *) lfirst(lc);
			Datum		values[6];
			bool		nulls[6] = {false};

			values[0] = CStringGetTextDatum(IdemLedgerName(ledger));
			values[1] = ObjectIdGetDatum(p->relid);
			values[2] = Int32GetDatum(IdemLaneLanes(p->lane));
			values[3] = Int32GetDatum(IdemLaneNumber(p->lane));
			values[4] = TimestampTzGetDatum(p->lower);
			values[5] = TimestampTzGetDatum(p->upper);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc,
								 values, nulls);
		}
		list_free_deep(partitions);
	}
	return (Datum) 0;
}
