-- examples/outbox/shipping.sql -- the shipping service's database: one
-- shipment per order event received (shipping.py).  No unique constraint
-- on order_id, on purpose: exactly once is the receiver's doing
-- (idem_consume_message on webhook-id, in the transaction of the INSERT),
-- and a duplicate would show here as a second row.
CREATE TABLE shipments (
	id			bigserial PRIMARY KEY,
	order_id	bigint NOT NULL,
	event_id	text NOT NULL,
	customer	text NOT NULL,
	seq			int NOT NULL,		-- the order's number for its customer
	created_at	timestamptz NOT NULL DEFAULT now()
);
