-- Channels route messages: an endpoint with channels receives only the
-- messages sharing one of them (JSON arrays; NULL = none).
ALTER TABLE messages ADD COLUMN channels TEXT;
ALTER TABLE endpoints ADD COLUMN channels TEXT;
-- Extra request headers an endpoint is sent (JSON object).
ALTER TABLE endpoints ADD COLUMN headers TEXT NOT NULL DEFAULT '{}';
-- Listing an application's messages, newest first.
CREATE INDEX messages_by_app ON messages(app_id, id);
