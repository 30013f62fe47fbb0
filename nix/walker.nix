# Walks a flake's outputs along parsed wildcard patterns. Each attribute
# found is printed as it is found, with builtins.trace, as one stderr line:
#   trace: gradient-walk {"a":[segments],"d":"/nix/store/...drv"}
#   trace: gradient-walk {"a":[segments],"f":true}      (failed)
# so the worker learns derivations while the walk goes on; the value is
# how many lines were printed.
# Every child is forced under tryEval so one broken attribute (throw/assert)
# does not abort the walk; its message is recovered separately.
#
# Sharding: of `shards` processes, this one (`shard`) emits only the
# attributes it owns: at the last enumerated level of a pattern, the
# children whose position in attrNames is shard modulo shards; what no
# enumeration reaches (explicit names), shard 0. The levels above are
# walked by every shard (they are few and cheap).
# Resuming: `done` names (by builtins.toJSON of their path) attributes an
# earlier process already printed; they are skipped unforced.
{ flakeRef, patterns, shard ? 0, shards ? 1, done ? { } }:
let
  inherit (builtins) attrNames concatMap tryEval isAttrs length head tail toJSON trace genList elemAt;
  outputs = (builtins.getFlake flakeRef).outputs;
  isDrv = v: isAttrs v && (v.type or null) == "derivation";
  opaque = v: isAttrs v && (v ? type || v ? _type) && !(isDrv v);
  isDone = path: done ? ${toJSON path};
  line = x: "gradient-walk " + toJSON x;
  failed = path: if isDone path then [ ] else trace (line { a = path; f = true; }) [ 1 ];
  emit = path: v:
    if isDone path then [ ]
    else
      let d = tryEval v.drvPath;
      in trace (line (if d.success then { a = path; d = d.value; } else { a = path; f = true; })) [ 1 ];
  # force a value and its derivation-ness together, catching throws
  probe = v: tryEval (let drv = isDrv v; in if drv then { inherit drv; value = v; } else { inherit drv; value = v; opaque = opaque v; attrs = isAttrs v; });
  mine = i: shards <= 1 || i - (i / shards) * shards == shard;
  # the names of an attrset this shard owns (the last enumerated level)
  owned = v: let ns = attrNames v; in
    if shards <= 1 then ns
    else concatMap (i: if mine i then [ (elemAt ns i) ] else [ ]) (genList (i: i) (length ns));
  # derivations directly below an attrset (a trailing wildcard's extra level)
  drvChildren = path: v:
    concatMap (n:
      if isDone (path ++ [ n ]) then [ ] else
      let p = probe v.${n}; in
      if !p.success then failed (path ++ [ n ])
      else if p.value.drv then emit (path ++ [ n ]) p.value.value
      else [ ]) (attrNames v);
  # own: null until an enumeration decides which shard owns the subtree
  walk = own: path: v: segs:
    let ours = if own == null then shard == 0 else own; in
    if segs == [ ] && !ours then [ ]
    else if segs == [ ] && isDone path then [ ]
    else
    let p = probe v; in
    if !p.success then (if ours then failed path else [ ])
    else
      let node = p.value; in
      if segs == [ ] then (if node.drv then emit path node.value else [ ])
      else if node.drv || !node.attrs then [ ]
      else
        let
          s = head segs;
          rest = tail segs;
          val = node.value;
        in
        if s.kind == "name" then
          (if val ? ${s.name} then walk own (path ++ [ s.name ]) val.${s.name} rest else [ ])
        else if path != [ ] && node.opaque then [ ]
        else if s.kind == "star" && rest == [ ] then
          concatMap (n:
            if isDone (path ++ [ n ]) then [ ] else
            let c = probe val.${n}; in
            if !c.success then failed (path ++ [ n ])
            else if c.value.drv then emit (path ++ [ n ]) c.value.value
            else if c.value.attrs && !c.value.opaque then drvChildren (path ++ [ n ]) c.value.value
            else [ ]) (owned val)
        else if rest == [ ] then
          concatMap (n: walk true (path ++ [ n ]) val.${n} rest) (owned val)
        else concatMap (n: walk own (path ++ [ n ]) val.${n} rest) (attrNames val);
in
length (concatMap (segs: walk null [ ] outputs segs) patterns)
