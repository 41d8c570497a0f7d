-- The finding tools (dashboard messages page, portal message log): a
-- search by event type walks only that type's messages, newest first, in
-- one application or in all; a search by eventId without an application
-- is one index lookup (with one, UNIQUE (app_id, event_id) serves).
CREATE INDEX messages_by_app_type ON messages(app_id, event_type, id);
CREATE INDEX messages_by_type ON messages(event_type, id);
CREATE INDEX messages_by_event_id ON messages(event_id) WHERE event_id IS NOT NULL;
