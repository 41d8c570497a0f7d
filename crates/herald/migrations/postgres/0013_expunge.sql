-- A message whose payload was erased (DELETE …/msg/{msg}/content, or
-- payload retention): the payload column is emptied and this says when.
-- Nothing is ever sent for such a message.
ALTER TABLE messages ADD COLUMN expunged_at BIGINT;
