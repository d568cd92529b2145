-- The service's own table, managed by Diesel's migrations (txbox's tables
-- are created by `PgStore::migrate`).
CREATE TABLE diesel_service_orders (
    id          BIGSERIAL PRIMARY KEY,
    customer    TEXT   NOT NULL,
    total_cents BIGINT NOT NULL
);
