-- Svix's message tags (a JSON array of at most 5 names; NULL: none) and
-- `deliverAt` (ms; NULL: at once), both returned on reads. A scheduled
-- message's deliveries are born pending, due at `deliver_at`.
ALTER TABLE messages ADD COLUMN tags TEXT, ADD COLUMN deliver_at BIGINT;
