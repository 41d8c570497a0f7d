-- Secrets replaced by a rotation that still sign during their grace period:
-- a JSON array of {"key": "whsec_…", "expiresAt": ms}, newest first, at
-- most 10.
ALTER TABLE endpoints ADD COLUMN old_secrets TEXT NOT NULL DEFAULT '[]';
