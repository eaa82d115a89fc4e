-- examples/outbox/orders.sql -- the orders service's database: orders,
-- each published as an event of topic "orders" in the transaction that
-- makes it (orders.py place).
CREATE TABLE orders (
	id			bigserial PRIMARY KEY,
	customer	text NOT NULL,
	item		text NOT NULL,
	placed_at	timestamptz NOT NULL DEFAULT now()
);
