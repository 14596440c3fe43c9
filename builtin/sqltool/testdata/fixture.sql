-- The database both SQL backends are tested against (SQLite file, and a
-- throwaway PostgreSQL schema first on the search_path). Portable SQL only.
CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL DEFAULT 'new', total INTEGER);
CREATE TABLE api_tokens (id INTEGER PRIMARY KEY, token TEXT NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);
INSERT INTO orders (id, status, total) VALUES (1, 'OPEN', 10), (2, 'open', 20), (3, 'Closed', 30), (4, 'closed', 40), (5, 'open', 50);
INSERT INTO api_tokens (id, token) VALUES (1, 'tok-secret-1'), (2, 'tok-secret-2');
INSERT INTO customers (id, name) VALUES (1, 'Ada'), (2, 'Linus');
CREATE VIEW token_view AS SELECT id FROM api_tokens;
CREATE VIEW nested_view AS SELECT * FROM token_view;
CREATE VIEW open_orders AS SELECT id, total FROM orders WHERE lower(status) = 'open';
