-- Two foreign keys go: each inserted message locked its application's row,
-- and each delivery its message's row, one row lock (and, with batches
-- committing side by side, one multixact) per row on the hottest path.
-- Every path that inserts messages or deliveries (the API's ingest, the
-- outbox function, resend) already takes those locks itself, once per
-- statement; the cascades they gave are now explicit deletes (deleting an
-- application deletes its messages; pruning a message deletes its
-- deliveries). deliveries.endpoint_id keeps its foreign key: deleting an
-- endpoint (and so an application) still removes its deliveries by cascade.
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_app_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_msg_id_fkey;
