-- (v4) The slack and teams channels: webhook deliveries to a Slack or Teams incoming webhook.
ALTER TABLE alerts.deliveries DROP CONSTRAINT deliveries_channel_check;
ALTER TABLE alerts.deliveries ADD CONSTRAINT deliveries_channel_check
    CHECK (channel IN ('in_site', 'email', 'sms', 'webhook', 'slack', 'teams'));
