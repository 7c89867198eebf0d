-- The gutter of memcached-operator (a start file of the proxy, loaded after memcached's
-- route library in the configuration VM and in every worker). Static: the operator writes
-- it unchanged; which commands use it, and the TTL, are in config.lua.
--
-- route_gutter{ child = ROUTE, child_gutter = "internal", mode = M, ttl = N, meta = bool }
-- sends the request to ROUTE (the pool's route) first, and uses the proxy's own cache
-- (routelib's "internal": memcached's storage in the proxy process) as a gutter:
--   mode "read":   on an error of the pool (its pod down, unreachable, its slot vacant),
--                  the answer comes from the gutter (a hit, or a miss).
--   mode "store":  on an error, the value is kept in the gutter with the TTL N in place of
--                  the client's;
--   mode "change": on an error, the change (delete, incr, append, ...) is made in the
--                  gutter;
--                  for both, once the pool has taken a write the key is dropped from the
--                  gutter, so it never holds a value older than the pool's.
-- A write always answers with the pool's result: one the pool did not take is an error
-- for the client, as without a gutter, and a pod that comes back without restarting
-- serves what it held, as without a gutter. `meta = true` marks meta commands: their
-- own TTL flags (`T`, and `N` for a key they create) are set to N on the way to the
-- gutter, so nothing lives there longer; base64 keys are dropped with their flag.
--
-- Must never raise an error while loading: a start file that fails stops memcached.
register_route_handlers({ "gutter" })

function route_gutter_conf(t, ctx)
    return t
end

local function route_gutter_f(rctx, o)
    -- A meta request's TTL flags, held to the gutter's TTL.
    local function hold_ttl(r)
        for _, flag in ipairs({ "T", "N" }) do
            if r:has_flag(flag) then
                r:flag_set(flag, o.ttl)
            end
        end
    end
    return function(r)
        local res = rctx:enqueue_and_wait(r, o.pool)
        if o.mode == "read" then
            if res:ok() then
                return res
            end
            if o.is_meta then
                hold_ttl(r)
            end
            return rctx:enqueue_and_wait(r, o.gutter) or res
        end
        if res:ok() then
            local b = ""
            if o.is_meta and r:has_flag("b") then
                b = " b"
            end
            rctx:enqueue_and_wait(mcp.request("md " .. r:key() .. b .. "\r\n"), o.gutter)
            return res
        end
        if o.is_meta then
            hold_ttl(r)
            if o.mode == "store" then
                r:flag_set("T", o.ttl)
            end
        elseif o.mode == "store" then
            r:token(4, o.ttl)
        end
        rctx:enqueue_and_wait(r, o.gutter)
        return res
    end
end

function route_gutter_start(a, ctx, fgen)
    local o = {
        pool = fgen:new_handle(a.child),
        gutter = fgen:new_handle(a.child_gutter),
        mode = a.mode,
        ttl = tostring(a.ttl),
        is_meta = a.meta,
    }
    fgen:ready({ a = o, n = ctx:label(), f = route_gutter_f })
end
