#!/usr/bin/env bash
# Writes plait's man page and bash completion from its own help text (plait
# --help and plait help CMD), so that neither can drift from the command line:
#   scripts/gen_docs.sh PLAIT OUTDIR
# makes OUTDIR/man/man1/plait.1 and OUTDIR/bash-completion/completions/plait.
# The help text's shape (cli.c and plait.c): "usage: plait NAME OPERANDS [OPTIONS]" lines,
# a summary, paragraphs, "options:" then "  --name ARG    text" rows whose
# continuation lines are indented, and a closing paragraph.
set -euo pipefail
plait=$1
out=$2
man=$out/man/man1/plait.1
comp=$out/bash-completion/completions/plait
mkdir -p "$(dirname "$man")" "$(dirname "$comp")"

version=$("$plait" --version | sed 's/^plait //')
overview=$("$plait" --help)
# the commands: the leading lower-case words of each row under "commands:"
mapfile -t commands < <(printf '%s\n' "$overview" | awk '
    /^commands:/ { on = 1; next }
    /^$/ { on = 0 }
    on && /^  [a-z]/ {
        left = substr($0, 3); sub(/  .*/, "", left); n = split(left, w, " "); name = ""
        for (i = 1; i <= n && w[i] ~ /^[a-z][a-z0-9-]*$/; i++) name = name (name ? " " : "") w[i]
        if (name !~ /^help/) print name
    }')

# roff: escape backslashes and dashes, and lines that start with a dot or quote
roff() { sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }

{
    echo ".TH PLAIT 1 \"\" \"plait $version\" \"User Commands\""
    echo ".SH NAME"
    printf 'plait \\- %s\n' "$(printf '%s\n' "$overview" | awk 'NR > 2 && /^$/ { exit } NR > 2' |
        tr '\n' ' ' | sed 's/ $//; s/^\(.\)/\L\1/' | roff)"
    echo ".SH SYNOPSIS"
    echo ".B plait"
    echo "\\fICOMMAND\\fR [\\fIARGS\\fR]"
    echo ".SH DESCRIPTION"
    printf '%s\n' "$overview" | awk 'NR > 2 && /^$/ { exit } NR > 2' | roff
    echo ".SH COMMANDS"
    for c in "${commands[@]}"; do
        # shellcheck disable=SC2086
        "$plait" help $c | awk -v name="$c" '
            function esc(s) { gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s); sub(/^[.'"'"']/, "\\\\&&", s); return s }
            NR == 1 { sub(/^usage: /, ""); print ".SS \"plait " name "\""; print ".nf"; print ".B " esc($0); syn = 1; next }
            syn && /^$/ { print ".fi"; syn = 0; para = 1; next }
            syn { sub(/^ +/, ""); print ".B \"   " esc($0) "\""; next }
            /^options:$/ { opts = 1; print ".PP"; print "Options:"; next }
            opts && /^  [^ ]/ {
                line = substr($0, 3); left = line; text = ""
                if (match(line, /  +/)) { left = substr(line, 1, RSTART - 1); text = substr(line, RSTART + RLENGTH) }
                print ".TP"; print ".B " esc(left); if (text != "") print esc(text); next
            }
            opts && /^ +[^ ]/ { sub(/^ +/, ""); print esc($0); next }
            /^$/ { opts = 0; print ".PP"; next }
            { print esc($0) }'
    done
    echo ".SH OPTIONS"
    echo ".TP"
    echo ".B \\-h, \\-\\-help"
    echo "print the overview (or, after a command, its help) and exit"
    echo ".TP"
    echo ".B \\-\\-version"
    echo "print plait's version and exit"
    echo ".SH SEE ALSO"
    echo "README.md and examples/ (installed under share/doc/plait and share/plait/examples)"
} >"$man.tmp"
mv "$man.tmp" "$man"

# every plan field's path, for --set (plait help plan)
plan_paths=$("$plait" help plan | awk 'NR > 1 { printf "%s%s=", (n++ ? " " : ""), $1 }')
# choices HELP: "--opt=a b c|..." for each option of a command's help whose text begins
# with the values it takes, "a (default), b or c" up to a colon, semicolon or its end
# (--gang KIND "jobset (default), kueue, volcano or coscheduling: who holds ...")
choices() {
    printf '%s\n' "$1" | awk '
        function flush() {
            if (opt == "") return
            gsub(/\([^)]*\)/, "", text); sub(/[:;].*/, "", text)
            gsub(/ +/, " ", text); sub(/^ /, "", text); sub(/ $/, "", text); gsub(/ ,/, ",", text)
            if (text ~ /^[a-z0-9-]+(, [a-z0-9-]+)*,? or [a-z0-9-]+$/) {
                gsub(/,? or |, /, " ", text)
                printf "%s%s=%s", (n++ ? "|" : ""), opt, text
            }
            opt = ""
        }
        /^options:$/ { on = 1; next }
        /^$/ { flush(); on = 0 }
        on && /^  -/ {
            flush(); split(substr($0, 3), w, /  +/); split(w[1], p, " ")
            if (p[2] != "") { opt = p[1]; text = w[2] }
            next
        }
        on && opt != "" { text = text " " $0 }
        END { flush() }'
}

# bash completion: per command, its options; values of options whose argument
# names a directory (DIR) or a file (FILE.xml, VAL.bin, PLAN) complete as such, and
# those of options whose help lists them (choices) as those
{
    echo "# bash completion for plait $version, generated from its help text by scripts/gen_docs.sh"
    echo "_plait() {"
    echo '    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}'
    echo '    local line=" ${COMP_WORDS[*]:1:COMP_CWORD-1} " opts="" dirs="" files="" values="" choices=""'
    echo '    case "$line" in'
    for c in "${commands[@]}"; do
        # shellcheck disable=SC2086
        help=$("$plait" help $c)
        opts=$(printf '%s\n' "$help" | awk '/^options:$/ { on = 1; next } /^$/ { on = 0 }
            on && /^  -/ { sub(/^  /, ""); split($0, w, /  +/); n = split(w[1], names, /, /);
                           for (i = 1; i <= n; i++) { split(names[i], p, " "); print p[1], (p[2] ? p[2] : "") } }')
        all=$(printf '%s\n' "$opts" | awk '{ printf "%s%s", (NR > 1 ? " " : ""), $1 }')
        dirs=$(printf '%s\n' "$opts" | awk '$2 == "DIR" { printf "%s%s", (n++ ? "|" : ""), $1 }')
        files=$(printf '%s\n' "$opts" | awk '$2 ~ /FILE|\.|PLAN/ && $2 != "DIR" { printf "%s%s", (n++ ? "|" : ""), $1 }')
        values=$(printf '%s\n' "$opts" | awk '$2 != "" && $2 != "DIR" && $2 !~ /FILE|\.|PLAN/ { printf "%s%s", (n++ ? "|" : ""), $1 }')
        listed=$(choices "$help")
        echo "    \" $c \"*) opts=\"$all\" dirs=\"${dirs}\" files=\"${files}\" values=\"${values}\" choices=\"${listed}\" ;;"
    done
    echo '    *)'
    echo '        if [ "$COMP_CWORD" -eq 1 ]; then'
    printf '            mapfile -t COMPREPLY < <(compgen -W "%s help -h --help --version" -- "$cur")\n' \
        "$(printf '%s\n' "${commands[@]}" | awk '{ print $1 }' | sort -u | tr '\n' ' ' | sed 's/ $//')"
    echo '        elif [ "${COMP_WORDS[1]}" = help ]; then'
    printf '            mapfile -t COMPREPLY < <(compgen -W "%s" -- "$cur")\n' \
        "$(printf '%s\n' "${commands[@]}" | awk '{ print $1 }' | sort -u | tr '\n' ' ' | sed 's/ $//')"
    echo '        else'
    echo '            local sub=""'
    for c in "${commands[@]}"; do
        case "$c" in *" "*) echo "            [ \"\${COMP_WORDS[1]}\" = \"${c%% *}\" ] && sub=\"\$sub ${c#* }\"" ;; esac
    done
    echo '            mapfile -t COMPREPLY < <(compgen -W "$sub" -- "$cur")'
    echo '        fi'
    echo '        return 0 ;;'
    echo '    esac'
    echo '    if [ "$prev" = --set ]; then'
    printf '        compopt -o nospace 2>/dev/null\n'
    printf '        mapfile -t COMPREPLY < <(compgen -W "%s" -- "$cur")\n' "$plan_paths"
    echo '    elif [ -n "$prev" ] && [[ "|$choices|" == *"|$prev="* ]]; then'
    echo '        local listed="|$choices|"'
    echo '        listed=${listed#*"|$prev="}'
    echo '        mapfile -t COMPREPLY < <(compgen -W "${listed%%|*}" -- "$cur")'
    echo '    elif [ -n "$prev" ] && [[ "|$dirs|" == *"|$prev|"* ]]; then'
    echo '        mapfile -t COMPREPLY < <(compgen -d -- "$cur")'
    echo '    elif [ -n "$prev" ] && [[ "|$files|" == *"|$prev|"* ]]; then'
    echo '        mapfile -t COMPREPLY < <(compgen -f -- "$cur")'
    echo '    elif [ -n "$prev" ] && [[ "|$values|" == *"|$prev|"* ]]; then'
    echo '        COMPREPLY=()'
    echo '    elif [[ "$cur" == -* ]]; then'
    echo '        mapfile -t COMPREPLY < <(compgen -W "$opts" -- "$cur")'
    echo '    else'
    echo '        mapfile -t COMPREPLY < <(compgen -f -- "$cur")'
    echo '    fi'
    echo '}'
    echo 'complete -o filenames -F _plait plait'
} >"$comp.tmp"
mv "$comp.tmp" "$comp"
