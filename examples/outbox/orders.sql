-- examples/outbox/orders.sql -- the orders service's database: customers
-- and their orders, each order published as an event of topic "orders" in
-- the transaction that makes it (orders.py place).  seq numbers a
-- customer's orders in the order their transactions commit (the customer's
-- row is locked by the UPDATE that takes it), which the shipping side
-- checks its shipments against.
CREATE TABLE customers (
	name		text PRIMARY KEY,
	seq			int NOT NULL DEFAULT 0
);
INSERT INTO customers (name) SELECT 'customer-' || i FROM generate_series(0, 19) AS i;

CREATE TABLE orders (
	id			bigserial PRIMARY KEY,
	customer	text NOT NULL REFERENCES customers,
	seq			int NOT NULL,
	item		text NOT NULL,
	placed_at	timestamptz NOT NULL DEFAULT now()
);
