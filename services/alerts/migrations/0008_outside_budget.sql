-- The outside messages (every channel but in-site) each account's alerts queued per day of the
-- platform time zone, and how many were held back beyond the daily budget. Its own table, not a
-- count of alerts.deliveries: deleting a rule deletes its deliveries, and a deleted rule's messages
-- were still sent (the pumping loop creates, fires and deletes rules over and over). The row is
-- locked by every transaction that records a firing of the account, so two at once cannot both
-- take the last slot.
CREATE TABLE alerts.outside_messages (
    account_id uuid    NOT NULL,
    day        date    NOT NULL,
    queued     integer NOT NULL DEFAULT 0,
    suppressed integer NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, day)
);
