-- The example shop database for the built-in sql.* tools (builtins.yaml).
-- toolgate creates shop.db from this script the first time it starts with
-- the example bundle (Database.init_sql); an existing shop.db is never
-- touched. Delete shop.db to rebuild it.
CREATE TABLE customers (
  id    INTEGER PRIMARY KEY,
  name  TEXT NOT NULL,
  email TEXT NOT NULL
);
CREATE TABLE orders (
  id          INTEGER PRIMARY KEY,
  customer_id INTEGER NOT NULL REFERENCES customers(id),
  status      TEXT NOT NULL,
  total_cents INTEGER NOT NULL,
  created_at  TEXT NOT NULL
);
-- Credentials: no agent's principal may read them.
CREATE TABLE api_tokens (
  id      INTEGER PRIMARY KEY,
  service TEXT NOT NULL,
  token   TEXT NOT NULL
);
-- A view reads its tables: a grant on the view alone is not enough.
CREATE VIEW order_totals AS
  SELECT c.name AS customer, count(*) AS orders, sum(o.total_cents) AS total_cents
  FROM orders o JOIN customers c ON c.id = o.customer_id
  GROUP BY c.name;

INSERT INTO customers (id, name, email) VALUES
  (1, 'Ada Lovelace', 'ada@example.com'),
  (2, 'Grace Hopper', 'grace@example.com'),
  (3, 'Alan Turing', 'alan@example.com');
INSERT INTO orders (id, customer_id, status, total_cents, created_at) VALUES
  (1, 1, 'Shipped', 4200, '2026-10-01'),
  (2, 1, 'shipped', 1999, '2026-10-03'),
  (3, 2, 'PENDING', 15000, '2026-10-04'),
  (4, 3, 'pending', 750, '2026-10-05'),
  (5, 2, 'cancelled', 3100, '2026-10-06');
INSERT INTO api_tokens (id, service, token) VALUES
  (1, 'payments', 'sk_live_example_do_not_leak'),
  (2, 'mail', 'mg_example_secret');
