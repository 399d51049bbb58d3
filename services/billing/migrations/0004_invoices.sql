-- (v2) Invoices of paid orders, numbered gaplessly per seller. The number is taken in the payment's
-- own transaction from the seller's counter row (not a sequence: a rolled-back payment rolls its
-- number back too, so the numbers are 1..N with no gap; the row lock orders concurrent payments).
CREATE TABLE billing.invoice_counters (
    seller      text PRIMARY KEY,
    last_number bigint NOT NULL DEFAULT 0
);

CREATE TABLE billing.invoices (
    order_id    uuid PRIMARY KEY REFERENCES billing.orders (id),
    seller      text NOT NULL,
    number      bigint NOT NULL,
    issued_at   timestamptz NOT NULL,
    buyer       jsonb NOT NULL,           -- the buyer as billing knew it at payment
    UNIQUE (seller, number)
);

-- The order history, newest first, by keyset (created_at, id).
CREATE INDEX orders_by_account_newest ON billing.orders (account_id, created_at DESC, id DESC);
DROP INDEX billing.orders_by_account;

-- Orders paid before invoices existed: numbered in payment order under the default seller
-- (services/billing/seller.toml), so every paid order has its invoice and the counter goes on from there.
INSERT INTO billing.invoices (order_id, seller, number, issued_at, buyer)
SELECT o.id, 'tollgate', row_number() OVER (ORDER BY o.paid_at, o.id), o.paid_at,
       jsonb_build_object('account_id', o.account_id, 'user_type', coalesce(a.user_type, 'individual'))
  FROM billing.orders o LEFT JOIN billing.accounts a ON a.account_id = o.account_id
 WHERE o.status = 'paid';
INSERT INTO billing.invoice_counters (seller, last_number)
SELECT 'tollgate', count(*) FROM billing.invoices;
