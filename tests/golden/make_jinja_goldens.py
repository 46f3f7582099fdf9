#!/usr/bin/env python3
"""The Jinja constructs chat templates lean on, each rendered by Python's jinja2 as
transformers sets it up (jinja2_oracle.py): writes tests/data/chat_templates/jinja_cases.json,
the goldens of tests/model/jinja_template_test.cpp.

    .venv-tools/bin/python tests/golden/make_jinja_goldens.py
"""
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja2_oracle  # noqa: E402

NOW = 1785024000  # strftime_now's clock, as the C++ test passes it
env = jinja2_oracle.environment(datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc))
cases = [
 ("{% for i in [1,2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}[{{ x }}]", {}),
 ("{% set x = 5 %}{% for i in [1,2] %}{{ x }}{% set x = i %}{{ x }}{% endfor %}[{{ x }}]", {}),
 ("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", {}),
 ("{{ [1, 'a', 2.5, none, true, {'k': [1]}] }}", {}),
 ("{{ 1e16 }} {{ 1e-5 }} {{ 0.1+0.2 }} {{ 3/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 10/2 }} {{ 1.5e300*1e10 }}", {}),
 ("{{ 'abc'[::-1] }} {{ [1,2,3][1:] }} {{ 'a b  c'.split() }} {{ 'x'*3 }} {{ 'héllo'[1] }} {{ 'héllo'|length }}", {}),
 ("{{ true + 1 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' ~ 1 ~ none }} {{ 'b' in 'abc' }} {{ 2 not in [1] }}", {}),
 ("a\n  {% if true %}\n  b\n  {% endif %}\n c {# comment #}\n d", {}),
 ("  {%- if true -%}  x  {%- endif -%}  ", {}),
 ("{% for k, v in d.items() %}{{ loop.index }}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}", {"d": {"b": 1, "a": [2]}}),
 ("{% for x in xs if x > 1 %}{{ loop.index0 }}/{{ loop.length }}:{{ x }} {% else %}none{% endfor %}", {"xs": [1, 2, 3]}),
 ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
 ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }}", {}),
 ("{{ d | tojson }} {{ d | tojson(indent=2) }} {{ d|tojson(separators=(',', ':'), sort_keys=true) }}", {"d": {"z": "é\"\n<", "a": [1, 2.0, None, True, {}]}}),
 ("{{ xs|map(attribute='n')|join('+') }} {{ xs|selectattr('n', 'gt', 1)|list|length }} {{ xs|rejectattr('n')|list }} {{ [3,1,2]|sort|first }} {{ ['b','A','a']|unique|list }}", {"xs": [{"n": 1}, {"n": 2}, {"n": 0}]}),
 ("{{ '  x  '|trim }}|{{ 'ab'|upper }}|{{ none|default('d') }}|{{ ''|default('d', true) }}|{{ 'a-b'|replace('-', '+') }}|{{ 'hello world'|title }}|{{ 3.7|int }}|{{ '4'|int + 1 }}|{{ 2|float }}", {}),
 ("{{ 'Hello {}, {name}!'.format('A', name='B') }} {{ 'a,b,,c'.split(',') }} {{ ' a b '.strip() }}|{{ 'xxhixx'.strip('x') }} {{ 'abc'.startswith(('x', 'a')) }}", {}),
 ("{% set a, b = [1, 2] %}{{ b }}{{ a }}{% set t %}block {{ a }}{% endset %}[{{ t }}]", {}),
 ("{{ x is defined }}{{ y is none }}{{ z is string }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ [] is iterable }}{{ {} is mapping }}{{ x is sameas false }}", {"x": False, "y": None, "z": "s"}),
 ("{{ strftime_now('%d %b %Y') }} {{ 'yes' if x else 'no' }} {{ ('a' if false) is defined }}", {"x": 0}),
 ("{% filter upper %}shout {{ 'it' }}{% endfilter %}", {}),
 ("{%- for m in messages -%}\n{{ m.role }}: {{ m['content'] }}\n{% endfor %}", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}),
 ("{% raw %}{{ not rendered }}{% endraw %} {{ \"it's\" }} {{ 'say \"hi\"' }}", {}),
 ("{{ [1,2,3]|reverse|list }} {{ 'abc'|reverse }} {{ {'a':1}|items|list }} {{ [1,2]|sum }} {{ [4,9]|max }} {{ 'a\nb'|indent(2, first=true) }}", {}),
 ("{{ '<x>'|safe + '<y>' }} {{ '<x>'|e }} {{ ['x'|safe] }}", {}),
 ("{{ -3|abs }} {{ (1,2) }} {{ d.get('a', 9) }} {{ d.keys()|list }} {{ 'b' in d }} {{ d['a'] }}", {"d": {"a": 1}}),
]
out = []
for src, ctx in cases:
    try:
        r = env.from_string(src).render(**ctx)
        out.append({"template": src, "context": ctx, "output": r})
    except Exception as e:
        out.append({"template": src, "context": ctx, "error": str(e)})
out_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "chat_templates",
                        "jinja_cases.json")
with open(out_path, "w") as f:
    json.dump({"now": NOW, "cases": out}, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"{out_path}: {len(out)} cases", file=sys.stderr)
