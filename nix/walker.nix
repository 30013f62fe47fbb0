# Walks a flake's outputs along parsed wildcard patterns and returns
# [{ attr = [segments]; drvPath = "..."; }] or [{ attr; failed = true; }].
# Every child is forced under tryEval so one broken attribute (throw/assert)
# does not abort the walk; its message is recovered separately.
{ flakeRef, patterns }:
let
  inherit (builtins) attrNames concatMap tryEval isAttrs length head tail;
  outputs = (builtins.getFlake flakeRef).outputs;
  isDrv = v: isAttrs v && (v.type or null) == "derivation";
  opaque = v: isAttrs v && (v ? type || v ? _type) && !(isDrv v);
  failed = path: [{ attr = path; failed = true; }];
  emit = path: v:
    let d = tryEval v.drvPath;
    in if d.success then [{ attr = path; drvPath = d.value; }] else failed path;
  # force a value and its derivation-ness together, catching throws
  probe = v: tryEval (let drv = isDrv v; in if drv then { inherit drv; value = v; } else { inherit drv; value = v; opaque = opaque v; attrs = isAttrs v; });
  # derivations directly below an attrset (a trailing wildcard's extra level)
  drvChildren = path: v:
    concatMap (n:
      let p = probe v.${n}; in
      if !p.success then failed (path ++ [ n ])
      else if p.value.drv then emit (path ++ [ n ]) p.value.value
      else [ ]) (attrNames v);
  walk = path: v: segs:
    let p = probe v; in
    if !p.success then failed path
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
          (if val ? ${s.name} then walk (path ++ [ s.name ]) val.${s.name} rest else [ ])
        else if path != [ ] && node.opaque then [ ]
        else if s.kind == "star" && rest == [ ] then
          concatMap (n:
            let c = probe val.${n}; in
            if !c.success then failed (path ++ [ n ])
            else if c.value.drv then emit (path ++ [ n ]) c.value.value
            else if c.value.attrs && !c.value.opaque then drvChildren (path ++ [ n ]) c.value.value
            else [ ]) (attrNames val)
        else concatMap (n: walk (path ++ [ n ]) val.${n} rest) (attrNames val);
in
concatMap (segs: walk [ ] outputs segs) patterns
