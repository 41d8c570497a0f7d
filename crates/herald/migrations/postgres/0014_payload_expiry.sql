-- payloadRetentionPeriod (Svix, days): when the message's payload is
-- erased; NULL: only HERALD_PAYLOAD_RETENTION applies.
ALTER TABLE messages ADD COLUMN payload_expires_at BIGINT;
CREATE INDEX messages_payload_expiry ON messages(payload_expires_at)
  WHERE payload_expires_at IS NOT NULL AND expunged_at IS NULL;
