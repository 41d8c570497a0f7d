-- A changed throttleRate moves the endpoint's next send slot (tat_us) as
-- if the last slot taken had been spaced at the new rate: a raise applies
-- from the next claim (the old spacing kept the next slot up to a whole
-- old step away: 0.4-0.5 s at 5/s where 100 ms is promised); a lowered
-- rate waits a second after the last slot, so that no second the receiver
-- counts holds more than the new rate + 1 (the old slots were denser).
-- The step is `throttle_step_us` (store/queue.rs): 1,010,000 is a second
-- and THROTTLE_DRIFT_US. SQLite does the same in update_endpoint.
--
-- Expand only: the function keeps its name and trigger; a process of the
-- previous release is unaffected (only this trigger writes on a change).
CREATE OR REPLACE FUNCTION herald_endpoint_throttle_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  IF NEW.rate_limit > 0 THEN
    INSERT INTO endpoint_throttle (endpoint_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
  END IF;
  IF TG_OP = 'UPDATE' AND OLD.rate_limit > 0 AND NEW.rate_limit > 0
     AND NEW.rate_limit <> OLD.rate_limit THEN
    UPDATE endpoint_throttle SET tat_us = tat_us
        - GREATEST((1000000 + OLD.rate_limit - 1) / OLD.rate_limit,
                   (1010000 + OLD.rate_limit) / (OLD.rate_limit + 1))
        + CASE WHEN NEW.rate_limit > OLD.rate_limit
               THEN GREATEST((1000000 + NEW.rate_limit - 1) / NEW.rate_limit,
                             (1010000 + NEW.rate_limit) / (NEW.rate_limit + 1))
               ELSE 1000000 END
     WHERE endpoint_id = NEW.id;
  END IF;
  RETURN NEW;
END $$;
