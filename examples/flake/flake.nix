{
  description = "Gradient's example: a small build graph that needs nothing but /bin/sh";

  # No inputs: no nixpkgs, nothing to download. Every builder is /bin/sh
  # running shell builtins only (echo, read, printf, while, set).
  outputs = { self }:
    let
      systems = [ "x86_64-linux" "aarch64-linux" ];
      forAllSystems = f: builtins.listToAttrs
        (map (system: { name = system; value = f system; }) systems);

      shell = system: name: script: builtins.derivation {
        inherit name system;
        builder = "/bin/sh";
        args = [ "-c" script ];
      };
    in
    {
      # greeting ─┬─ shout ───┐
      #           ├─ repeat ──┼─ report
      #           └─ count ───┘
      packages = forAllSystems (system:
        let sh = shell system; in rec {
          greeting = sh "greeting" ''
            echo "writing the greeting"
            echo "hello from gradient" > $out
          '';

          shout = sh "shout" ''
            read line < ${greeting}
            echo "shouting: $line"
            echo "$line!" > $out
          '';

          repeat = sh "repeat" ''
            read line < ${greeting}
            i=1
            while [ $i -le 3 ]; do
              echo "round $i: $line"
              printf '%s. %s\n' "$i" "$line" >> $out
              i=$((i + 1))
            done
          '';

          count = sh "count" ''
            read line < ${greeting}
            set -- $line
            echo "the greeting has $# words"
            echo "$#" > $out
          '';

          report = sh "report" ''
            echo "collecting the results"
            {
              echo "shout:"
              while read l; do echo "  $l"; done < ${shout}
              echo "repeat:"
              while read l; do echo "  $l"; done < ${repeat}
              read n < ${count}
              echo "count: $n words"
            } > $out
            while IFS= read -r l; do echo "$l"; done < $out
          '';

        });
    };
}
