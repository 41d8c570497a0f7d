-- The W3C traceparent of the request that created a message (when it had
-- one, or when Herald traces): sent on each of its attempts so receivers
-- can join the caller's trace.
ALTER TABLE messages ADD COLUMN traceparent TEXT;
