#!/bin/sh
# @COMPILER@ replaying the inlining decisions of this directory (written by mlgo's decisions,
# mlgo/ship/decisions.py, which fills in the @NAMES@): for a compile of one source under the
# project root, DIR/files/<its path>.inl; for a link that writes PROGRAM, DIR/links/PROGRAM.inl.
# A source or program with no file gets clang's own decisions; a file that is not a decisions
# file of this format gets them too, said in one line; so do the moved call sites of a source
# changed since its decisions were recorded (by its cksum), said in one line. A compile that
# replays a file also gets DIR/flags, as the recorded build had them (call-site locations in
# a -g0 build: keys must match), and so does every compile where DIR holds a program's
# decisions (its link replays them on the compiles' bitcode); the others pay nothing for
# locations. Where the decisions were made on code optimized with a profile (a tune on top
# of PGO), DIR/default.profdata is that profile, and every compile uses it. Builtins only,
# but one grep to check a file before clang reads it (clang stops a compile at a line it
# cannot parse) and one cksum of a source that replays one.
compiler=@COMPILER@
# the project's root: as recorded (from this directory), or @ROOT_ENV@ (absolute) for a copy
root_from_dir=${@ROOT_ENV@:-@ROOT_FROM_DIR@}
header=@HEADER@
locate_every_compile=@LOCATE_EVERY_COMPILE@
profiled=@PROFILED@
line=@LINE_ERE@
source_prefix=@SOURCE_PREFIX@
here=$PWD
case $0 in */*) dir=${0%/*} ;; *) dir=. ;; esac
case $dir in /*) ;; *) dir=$here/$dir ;; esac

# The one source compiled (by suffix: @SUFFIX_FACT@), and the output.
src= sources=0 out= prev=
for arg do
  case $prev in -o | --output) out=$arg ;; esac
  case $arg in
    -obj*) ;;
    -o?*) out=${arg#-o} ;;
    -*) ;;
    @SUFFIX_PATTERN@) src=$arg sources=$((sources + 1)) ;;
  esac
  prev=$arg
done

decisions= replayed=
if [ "$sources" = 1 ]; then
  case $src in */*) sdir=${src%/*} ;; *) sdir=. ;; esac
  case $root_from_dir in /*) root=$root_from_dir ;; *) root=$dir/$root_from_dir ;; esac
  if CDPATH= cd -P -- "${sdir:-/}" 2>/dev/null; then
    source=$PWD/${src##*/}
    if CDPATH= cd -P -- "$root" 2>/dev/null; then
      case $source in "$PWD"/*) decisions=$dir/files/${source#"$PWD"/}.inl ;; esac
    fi
    # no file there: a copy of this directory inside its project (committed, cloned to
    # another path) finds the root as the ancestor of this directory under which the
    # source has one
    if [ ! -f "$decisions" ] && CDPATH= cd -P -- "$dir" 2>/dev/null; then
      up=$PWD
      while [ -n "$up" ]; do
        up=${up%/*}
        case $source in
          "$up"/*) if [ -f "$dir/files/${source#"$up"/}.inl" ]; then
              decisions=$dir/files/${source#"$up"/}.inl && break
            fi ;;
        esac
      done
    fi
  fi
  CDPATH= cd -- "$here" || exit 1
elif [ "$sources" = 0 ] && [ -n "$out" ]; then
  decisions=$dir/links/${out##*/}.inl
fi

if [ -n "$decisions" ] && [ -f "$decisions" ]; then
  first= second=
  { IFS= read -r first && IFS= read -r second; } <"$decisions"
  LC_ALL=C grep -qvE -e "$line" -- "$decisions" 2>/dev/null
  if [ $? = 1 ] && [ "$first" = "$header" ]; then
    if [ "$sources" = 1 ]; then
      set -- "$@" @REPLAY_FLAGS@
      replayed=1
      # the source as recorded? its second line says (the only cost here: one cksum)
      case $second in
        "$source_prefix"*)
          recorded=${second#"$source_prefix"} && recorded=${recorded%%"'"*}
          [ "$(cksum <"$source" 2>/dev/null)" = "$recorded" ] ||
            echo "mlgo: $src changed since its decisions were recorded; its moved call sites get clang's own decisions (mlgo decisions check says how many still match)" >&2
          ;;
      esac
    else
      set -- "$@" @LINK_REPLAY_FLAGS@
    fi
  else
    echo "mlgo: $decisions is not a decisions file of mlgo-decisions @VERSION@; clang's own decisions" >&2
  fi
fi
if [ "$sources" != 0 ] && [ -n "$replayed$locate_every_compile" ]; then
  set -- "$@" @FLAGS@
fi
# The profile only if it is one: a regular file where it leads (not a FIFO, a device or a
# directory: `[ -f ]` follows links), the user's or root's, of a sane size, that starts as
# an indexed profile does; else the compile goes on without it, said in one line. Only
# builtins on the way to a compile that succeeds; the rest is checked when clang fails.
is_profile() {
  # shellcheck disable=SC2086 # root_owned: no word, or find's two
  [ -n "$(find -L "$profile" -prune $root_owned -size -@PROFILE_SIZE@c 2>/dev/null)" ] &&
    case $(od -An -tx1 -N8 <"$profile" 2>/dev/null) in *"@PROFILE_MAGIC@"*) ;; *) false ;; esac
}
if [ "$sources" != 0 ] && [ -n "$profiled" ]; then
  profile=$dir/@MERGED@ root_owned=
  [ -O "$profile" ] || root_owned='-user 0'
  if [ -f "$profile" ] && { [ -z "$root_owned" ] || is_profile; }; then
    "$compiler" "$@" @PROFILE_FLAGS@ && exit 0
    status=$?
    is_profile && exit $status
  fi
  echo "mlgo: $profile is not an indexed profile of yours (a regular file of at most @PROFILE_LIMIT@, yours or root's); compiling without it" >&2
fi
exec "$compiler" "$@"
